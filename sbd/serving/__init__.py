"""Serving: `create_app` (the OpenAI-compatible FastAPI app over the per-row engine), its worker thread,
metrics and request shapes, and the Ray Serve application (`ray_app`). Needs the serve extra."""
