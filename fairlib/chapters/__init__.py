"""Book-only code: what the chapters call and nothing in the library imports.

Modules: ``book`` (display helpers, glue), ``published`` (the published figures and their
comparison), ``presets`` (the seed-000 scenario), ``grid`` (the reference grid of chapters 2-4),
``experiments`` and ``methods`` (chapter computations), ``tenantbench`` (the tenantbench
scenarios, chapter 7), ``fidelity`` (simulator against engines, chapter 8), ``live`` (saved live
runs next to their simulated twins).
"""
