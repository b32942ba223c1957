"""OpenAI's Responses API (``/v1/responses``), served through the chat completions path."""
