"""The control plane's side of the capability matrix: the catalog built from published entries,
publication and its consistency checks. The file model and the constraint language are the
kernel's (`vidroute_core.capabilities`), shared with the adapter sidecars.
"""
