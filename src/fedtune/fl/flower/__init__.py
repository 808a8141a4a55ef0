"""The Flower transport of the Federation contract (Flower 1.41 Message API, ``flwr.serverapp.Grid``).

Only what sits below the algorithms: ``GridFederation`` (``federation``) is the server side of a
Flower federation, a ``Federation`` like the in-process one, and ``codec`` maps payloads
one-to-one onto ``ArrayRecord`` + ``ConfigRecord``. Bytes are counted, failed and late clients
recorded and replies validated exactly as in simulation.

Modules:
- ``codec``: Payload <-> ``RecordDict`` (lossless, key order kept, bf16 refused);
- ``federation``: ``GridFederation`` (SuperNodes are mapped to stable client ids by their
  ``partition-id`` node config; sampling is seeded as in simulation).

The Flower app that uses them (ServerApp, ClientApp, SuperNode runtime, deployment, the
``fedtune flower`` commands) is ``fedtune.flower``, above the algorithms and the runner.
"""
