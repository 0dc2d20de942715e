"""Settings: what a run may be told, with each setting's type and range, the options of each
config group, and the one-line errors for bad input.

Bottom of the import order: imports no other folder of the package.
"""
