"""The OpenAI-compatible routes' logic apart from HTTP: turning a request into
generations of a repository model and their answers into text (``generation``), and
embeddings (``embeddings``). ``reposerve.http.openai`` serves them; chat templates are
``reposerve.config.chat_templates``, which model loads check."""
