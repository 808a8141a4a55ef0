"""The Flower app (Flower 1.41 Message API): fedtune's experiments on a real Flower federation.

Everything that speaks Flower lives in this one package. The same algorithm code runs unchanged: a
generic ``ServerApp`` (``server_app``) runs the usual ``Runner`` loop with a ``GridFederation``
(``grid``) in place of the in-process federation, and a generic ``ClientApp`` (``client_app``)
dispatches ``"train.<task>"`` / ``"query.<task>"`` messages to the method's client task table
(``Algorithm.client_table``). Payloads map one-to-one onto ``ArrayRecord`` + ``ConfigRecord``
(``codec``); bytes are counted, failed and late clients recorded and replies validated exactly as in
simulation, so both backends write the same metrics for the same job.

The package as a whole sits above the algorithms and the runner (it finds algorithms and starts
runs). Its transport, ``grid`` and ``codec``, is the Flower backend of the Federation contract and
imports nothing but ``fedtune.fl`` (``tests/unit/test_import_graph.py`` keeps it so): the
in-process and Ray backends live in ``fedtune.fl`` itself, this one lives beside the Flower app that
is its only user, so that both sides of the Flower backend are read in one package.

Modules:
- ``grid``: ``GridFederation``, the server side of the Federation contract on a Flower ``Grid``
  (SuperNodes are mapped to stable client ids by their ``partition-id`` node config; sampling is
  seeded as in simulation); ``codec``: Payload <-> ``RecordDict`` (lossless, key order kept, bf16
  refused);
- ``server_app`` / ``client_app``: the Flower apps; ``node``: one client's runtime and task
  execution, Flower-free; ``worker``: a warm per-SuperNode process that keeps models loaded;
- ``tls``: the SuperLink's CA and certificate; ``keys``: SuperNode authentication key pairs;
- ``processes``: SuperLink/SuperNode/worker command lines, starting and stopping processes;
- ``connection``: ``FlowerConnection`` (``flwr``'s configuration), submitting and watching runs;
- ``app``: writing the Flower App (its ``pyproject.toml``) a run is submitted as;
- ``local``: ``LocalDeployment`` (everything on loopback, as subprocesses) and
  ``fedtune run --backend flower`` / ``fedtune resume``; ``cli``: ``fedtune flower ...``.

Deviations and known limits (Flower 1.41 as installed here):
- Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process (~2 s of imports before
  any work). Loading torch and the model per message would cost ~10 s per client per round, so
  each SuperNode has a warm client worker (``worker``) and the ClientApp relays the task to it
  over a Unix socket; ``--no-worker`` (``fedtune flower supernode``) runs tasks in the ClientApp
  process instead. The fixed latency that remains (SuperNode polls every 3 s, ClientApp process
  start, reply push polling) is ~5-9 s per round on 2 busy cores: see P8 in bench/README.md.
- A killed SuperNode is detected by the round's timeout (``fed.client_timeout``, else
  ``flower.reply_timeout``): the SuperLink marks a node offline only after ~60 s without heartbeat.
  A restarted SuperNode gets a new node id and takes its partition's place at the next call; a new
  ServerApp's greeting stops waiting for the vanished node's hello once the live nodes serve every
  client (it would otherwise wait until the SuperLink drops the node).
- Client state that must persist lives in ``context.state`` and on the client's disk (a checkpoint
  per round); the server's checkpoints hold no client state on this backend. Algorithms that
  read the simulation's ``fed.states`` on the server (FedIT's standalone-mode evaluation of the
  personal adapters) fall back to the global model on Flower.
- The ServerApp needs the run's clients and evaluation data on the server machine: client ids and
  partition sizes come from the server's own ``prepare_data``; a SuperNode may train on its own
  ``data-path`` instead of its partition.
- ``fedtune resume DIR`` restarts a *loopback* deployment; a multi-machine run is resumed with
  ``fedtune flower submit --resume -o DIR`` against the running SuperLink.
"""
