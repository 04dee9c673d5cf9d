"""An OpenAI-compatible simulated LLM engine: its scheduling model (engine) and its HTTP app."""
