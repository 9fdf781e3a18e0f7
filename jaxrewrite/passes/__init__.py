"""One module per pass; each exposes `run(cj, ctx) -> (ClosedJaxpr, changed)`.

See `jaxrewrite/_pipeline.py` for the order. Passes import only from the ground layer
(`_compat`, `_walk`, `_report`, `_structural`, `_indexmap`, `_cost`), never from each other.
"""
