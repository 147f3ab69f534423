"""The built-in tasks, one module each; :mod:`app.vbvr.registry` lists and names them."""
