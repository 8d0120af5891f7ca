"""The HTTP inference server, by concept: settings.py (limits), batcher.py (the micro-batcher) and jobs.py (what
its worker runs), service.py (the served model: texts to rows, rows through the batcher), routes/ (the routes, one
module per concept), schemas.py (request and response bodies), errors.py (error answers), limits.py (body size, API
key, read deadline), metrics.py (Prometheus), docs.py (the offline /docs page), tei.py, cohere.py and
input_types.py (other APIs' shapes), and app.py (the application put together, load_app, serve).

Only settings and the batcher are re-exported here: the CLI reads them without FastAPI installed; the application
is `bertforge.inference.serve.app`.
"""

from bertforge.inference.serve.batcher import Job, MicroBatcher, QueueFull
from bertforge.inference.serve.settings import API_KEY_VARIABLE, LONG_TEXT_POLICIES, ServeSettings

__all__ = ["API_KEY_VARIABLE", "LONG_TEXT_POLICIES", "Job", "MicroBatcher", "QueueFull", "ServeSettings"]
