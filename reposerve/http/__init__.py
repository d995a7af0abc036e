"""The HTTP front: routes as data, thin handlers, error -> status mapping, serving."""
