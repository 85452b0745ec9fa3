"""The simserver: the engine model served live as an SGLang-like OpenAI replica."""
