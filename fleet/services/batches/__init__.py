"""The Batch API (OpenAI's ``/v1/files`` and ``/v1/batches``): batches run on what
interactive traffic leaves, through the gateway's own routing and limits.

- ``jsonl``: an input file checked line by line (pure; the gateway's body rule is given).
- ``files``: files kept in the ``batches`` storage, output files written once.
- ``owners``: which team or key sees a file or batch, and pages of a list.
- ``lifecycle``: a batch's statuses, each change a guarded update; create, cancel,
  validate, finish; how the API shows batches and files.
- ``credentials``: what a batch's lines carry to the gateway to act as its key.
- ``pause``: when a line may start (interactive requests first), a pure rule.
- ``leases``: whom a runner works for (an owner), and its lease: one worker at a time.
- ``sending``: a line sent to the gateway, and whether its answer is the line's.
- ``runner``: beat's tick, one slice of an owner's lines sent and answers written.

Adding an endpoint a batch may run: its URL in ``jsonl.ENDPOINTS`` (and its body
rule in the gateway); the runner sends whatever URL a line names.
"""
