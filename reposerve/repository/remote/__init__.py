"""Remote model repositories (``s3://``, ``gs://``, ``az://``): each is mirrored into a local
cache folder, which the local-folder machinery then serves like any repository.

``reposerve.locations`` reads the URL, ``filesystems`` opens the bucket through fsspec (credentials
as each cloud's own tools read them), ``mirror`` copies one repository into its cache
folder, and ``mirrors`` holds the server's mirrors and pulls them when asked (at start-up,
on each poll, before an explicit load).
"""
