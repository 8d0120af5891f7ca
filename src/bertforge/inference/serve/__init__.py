"""The HTTP inference server, by concept: settings.py (limits), batcher.py (the micro-batcher), limits.py (body
size, API key, read deadline), metrics.py (Prometheus), schemas.py (request and response bodies), docs.py (the
offline /docs page) and app.py (the routes over the task rows, load_app, serve).

Only settings and the batcher are re-exported here: the CLI reads them without FastAPI installed; the application
is `bertforge.inference.serve.app`.
"""

from bertforge.inference.serve.batcher import Job, MicroBatcher, QueueFull
from bertforge.inference.serve.settings import API_KEY_VARIABLE, LONG_TEXT_POLICIES, ServeSettings

__all__ = ["API_KEY_VARIABLE", "LONG_TEXT_POLICIES", "Job", "MicroBatcher", "QueueFull", "ServeSettings"]
