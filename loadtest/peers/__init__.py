"""Ferry's Python peers for ``make bench``: what a user of Ray Serve, BentoML or LitServe would
write to put the same Triton model behind an HTTP API with the framework's own batching.

Every peer is a module run with the peers' interpreter (``.tools/peers/bin/python``, the
``bench`` extra in a venv of its own, never in ``make up``'s or ``make test``'s install)::

    .tools/peers/bin/python -m loadtest.peers.<name> --port 8100 --triton 127.0.0.1:8001 \\
        --model fast_1i --workers 2 --max-batch 64 --max-wait-ms 50

and answers the same contract (``loadtest.peers.common``): ``POST /predict`` with the JSON body
``{"input": "<text>"}`` answers ``200`` with the model's output for that input, the JSON object
the sim model returns (``{"sha256": ..., "length": ...}``). Each batches with its framework's
batching (at most ``--max-batch``, waiting at most ``--max-wait-ms``, adaptive where the
framework has it) and sends the whole batch to Triton in one gRPC call (``common.infer_batch``).
"""
