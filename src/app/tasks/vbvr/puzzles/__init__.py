"""The built-in tasks, one module each; :mod:`app.tasks.vbvr.registry` lists and names them."""
