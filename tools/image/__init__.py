"""The container image: found engine, base image, build (``python -m tools.image``, which
``make image`` runs). ``engine`` wraps docker, podman or buildah; ``base`` makes a Debian base
with mmdebstrap where the registry's base cannot be pulled; ``build`` turns the Dockerfile and
this checkout into a tagged image, skipping the build when its inputs are those of the image
already there."""
