"""The leaves every wing needs, below the spine: the request record, the error type, the
parsed request, usage, SSE framing and the config error. Nothing here imports the rest of
router."""
