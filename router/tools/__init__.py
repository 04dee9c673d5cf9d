"""Commands beside serving: the loop runner, the worker supervisor, the demo, the load test."""
