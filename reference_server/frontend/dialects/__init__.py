"""The frontend's dialects: foreign inference protocols served by translation onto lmrpc.v1.

``base/`` holds what every dialect shares; each other folder is one protocol and imports only
``base/``, never another dialect.
"""
