"""One module per `ftd` sub-command; each exposes ``register(subparsers)``.

``register`` adds its parser and sets ``handler`` to a function ``(args) -> int`` (the exit code).
Heavy imports happen inside the handler so ``ftd --help`` and ``ftd parse`` start fast.
"""
