"""One module per pass; each exposes `run(cj, ctx) -> (ClosedJaxpr, changed)`.

See `jaxrewrite/_pipeline.py` for the order. Passes import from the ground layer (`_compat`,
`_walk`) and the support folders (`analysis/`, `backend/`, `report/`); a pass that builds on
another imports it (`reroll`: `outline`, `recompute`, `flatten`; `flatten`: `loop_carry`,
`scalarize`; `loop_carry`: `fold`).
"""
