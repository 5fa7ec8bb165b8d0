"""The inference log: a sampled share of each logged model's finished tasks, with what the model
was asked and answered, written out for audits, drift and the next training set
(docs/inference-log.md).

``record`` decides which tasks are logged (a hash of the task id against the model's rate) and
makes a task's record (payloads cut at a size cap, named fields redacted); ``handoff`` gives
the batcher's task store the records of each batch it completes, in the background, to one
bounded stream per model (``lua/hand_off.lua``: past the bound, records are dropped and
counted, never waited for); ``logger`` is the process that drains the streams into a ``sinks``
sink (rotated JSONL files in a directory or a bucket, or CloudEvents over HTTP, ``events``),
acknowledging records only once the sink holds them; ``cli`` is ``ferry log tail``.
"""
