"""The decision core: stdlib only (no web, no ML frameworks).

It owns the types, the ports engines implement (`ports`), prompts, plans and scoring.
"""
