"""A vLLM-faithful replica simulator: OpenAI API, KV blocks, continuous batching, prefix cache."""
