"""OpenAI's protocol in the main process: /v1/completions, /v1/chat/completions (plain, with tools:
tool_calls.py plans them, tool_parsers/ reads each model's call format; with a reasoning model's
thinking: reasoning_parser.py) and the Responses API (responses_*.py), all through the tokenizer
manager of http/ and the shared flow of openai_routes.py."""
