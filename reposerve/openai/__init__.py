"""The OpenAI-compatible routes' logic apart from HTTP: chat templates (``templates``),
turning a request into generations of a repository model and their answers into text
(``generation``), and embeddings (``embeddings``). ``reposerve.http.openai`` serves them."""
