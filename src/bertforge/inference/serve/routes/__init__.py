"""The server's routes, one module per concept: embeddings.py (vectors, by every API that asks for them),
ranking.py (texts ranked for a query), tasks.py (a fine-tuned model's answers, masked words, POST /), tokens.py
(tokenize, decode), pages.py (the attention and explanation pages, /docs) and status.py (health, metrics, the
model's description). Each route reads the request, asks the ServedModel, and shapes the answer."""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel

from bertforge.inference.serve.service import ServedModel


def served_model(request: Request) -> ServedModel:
    return request.app.state.served


# A route's parameter for the model it serves (a FastAPI dependency: not part of the request's schema)
Served = Annotated[ServedModel, Depends(served_model)]


def sent_by_infinity_client(request: BaseModel) -> bool:
    """Whether a request comes from Infinity's generated client, which sends raw_scores with every rerank and
    classify request (its default, False, included) and reads Infinity's answers, not vLLM's."""
    return "raw_scores" in request.model_fields_set


class Routes:
    """A module's routes, declared once where they are written and added to each application with FastAPI's own
    add_api_route (FastAPI's APIRouter includes routes differently from one version to the next). `runs_model`: a
    route's default for whether it runs the model (which --max-concurrent-requests limits); a route may say
    otherwise."""

    def __init__(self, runs_model: bool = False):
        self.runs_model = runs_model
        self.declared: list[tuple[str, str, Callable, dict[str, Any]]] = []
        self.model_routes: set[tuple[str, str]] = set()  # (method, path)

    def route(self, method: str, path: str, runs_model: bool | None = None, **options
              ) -> Callable[[Callable], Callable]:
        def declare(endpoint: Callable) -> Callable:
            self.declared.append((method, path, endpoint, options))
            if self.runs_model if runs_model is None else runs_model:
                self.model_routes.add((method, path))
            return endpoint
        return declare

    def get(self, path: str, **options):
        return self.route("GET", path, **options)

    def post(self, path: str, **options):
        return self.route("POST", path, **options)

    def head(self, path: str, **options):
        return self.route("HEAD", path, **options)

    def add_to(self, app: FastAPI) -> None:
        for method, path, endpoint, options in self.declared:
            app.add_api_route(path, endpoint, methods=[method], **options)
