"""The operator's console: cluster, node, model, batches and costs pages inside the admin.

Pages and the fragments that refresh them in place (``views``), who may see
them and the admin's frame around them (``pages``), actions on a node
(``node_actions``) and clearing a GPU's fault (``gpus``), charts drawn as SVG
on the server (``svg``); what they show comes from
``fleet.services.console`` and ``fleet.services.charts``. Templates are in
templates/console/, the stylesheet and the one small script in
fleet/static/fleet/. Add a page: a function in ``services.console`` that
reads in a fixed number of queries, a view here, a template extending
admin/base_site.html, and a test in tests/console/.

Stable hooks for browser tests (ids and classes the pages keep):

- cluster: ``#cluster-body`` (refreshed; ``data-refreshed-at`` set by the script
  after each refresh), ``#cluster-filter``, ``#cluster-warnings``,
  ``#cluster-totals`` (``#total-nodes``, ``#total-gpus``, ``#total-replicas``,
  ``[data-state=ready]``, ``[data-total=gpus-used]``, ``[data-replicas=pending]``),
  ``#cluster-nodes`` with ``tr.node-row[data-node-id]`` whose cells are
  ``.node-id a`` (the node page), ``.node-state``, ``.node-connected``,
  ``.bar.cpu``, ``.bar.ram`` and ``.bar.gpu[data-gpu-index]`` (``data-percent``:
  the bar's width, empty when unknown; ``.label`` its text), ``.engines .engine``,
  ``.node-shards``, ``.node-last-seen``; ``#cluster-pages``, ``#cluster-models``
  (``tr.model-row[data-model]``, ``.model-asleep``, ``.model-scaling``),
  ``#cluster-pending`` (``tr.pending-row``, ``.reason``), ``#cluster-asleep`` (only
  while replicas sleep: ``tr.asleep-row[data-replica-id]``, ``.asleep``),
  ``#cluster-updated``; ``#nav-cluster`` in every admin header,
  ``#cluster-link`` on the admin index.
- node: ``#node[data-node-id]``, ``#node-actions`` (``#action-cordon``,
  ``#action-uncordon``, ``#action-drain``, ``#action-revoke``), ``#node-body``
  (refreshed) with ``#node-summary``, ``#node-state``, ``#node-asleep`` (while
  shards sleep there), ``#node-load``,
  ``#node-disks``, ``#node-weights`` (``tr.weights-row[data-path]`` with
  ``.weights-size``, ``.weights-source``, ``.weights-last-used``,
  ``.weights-pinned``, ``.weights-in-use-by``, ``.weights-removal``; a ``p``
  saying the permission it needs instead of the table for staff without
  ``fleet.view_localweights``), ``#node-gpus``, ``#node-engines``, ``#node-shards``
  (``tr.shard-row[data-shard-id]``, ``.shard-state`` with ``.asleep``,
  ``.shard-cores``, ``.shard-memory``);
  ``#node-charts`` (refreshed; ``.charts[data-source=history|prometheus]``,
  ``figure.chart#chart-cpu|memory|load|model-cores|model-memory|queue`` with
  ``data-points``, each line ``.series[data-series][data-points]``);
  ``#node-logs`` with ``#node-logs-form``, ``#node-logs-source``,
  ``#node-logs-fetch``, ``#node-logs-output`` (``.logs[data-kind=ok|error|
  disconnected|timeout]``, ``#node-logs-lines``, ``#node-logs-error``).
- confirmation: ``#node-confirm[data-action]``, ``#confirm-<action>`` (submit).
- model: ``#model[data-model]``, ``#model-body`` (refreshed), ``#model-summary``,
  ``#model-scaling`` (``autoscaler.status.scaling_status``, "not autoscaled"
  without), ``#model-bounds``, ``#model-waiting``, ``#model-idle``, ``#model-sleep``
  (``autoscaler.status.sleep_policy``, "never" without),
  ``#model-last-decision`` (``.reason``),
  ``#model-rps``, ``#model-latency``, ``#model-queue``, ``#model-replicas``
  (``tr.replica-row[data-replica-id]``, ``.replica-state`` with ``.asleep``,
  ``.reason``).
- batches: ``#batches-filter``, ``#batches-body`` (refreshed) with
  ``#batches-list`` (``data-count``: all that match, ``data-shown``) of
  ``tr.batch-row[data-batch-id][data-status]`` whose cells are ``.batch-id a``
  (the batch's page), ``.batch-owner``, ``.batch-endpoint`` (``.batch-models``),
  ``.batch-status`` (``.batch-paused``), ``.batch-progress`` (``.bar.progress``
  with ``data-percent``, ``.progress-text``), ``.batch-created``,
  ``.batch-expires``, ``.batch-files`` (``.batch-output``, ``.batch-errors``);
  ``#batches-more`` (when more match than are shown), ``#batches-updated``;
  ``#nav-batches`` in every admin header for staff with ``fleet.view_batch``.
- costs: ``#costs[data-start][data-end][data-period]`` (a named period or
  "custom"), ``#costs-period`` (``select[name=period]``), ``#costs-dates``
  (``#costs-from``, ``#costs-to``), ``#costs-csv`` (the API's CSV of the period),
  ``#costs-error``, ``#costs-seen`` (whose costs a member sees), ``#costs-unpriced``,
  ``#costs-totals`` (``.total[data-currency]`` with ``[data-total=cost|gpu-hours|
  tokens|idle-share]``), ``figure.chart#chart-cost-<currency>`` (``data-points``;
  each ``rect.segment[data-series][data-day][data-cost]``, ``.segment.idle`` on
  top), ``#costs-teams`` (``tr.team-row[data-team]`` with ``.team``, ``.gpu-hours``,
  ``.cost``, ``.tokens``, ``.per-million``, ``.utilisation``, ``.budget``),
  ``#costs-models`` (``tr.model-row[data-team][data-model]``), ``#costs-idle``
  (``tr.idle-row[data-gpu]``; absent for a member of a team), ``#costs-updated``;
  ``#nav-costs`` in every admin header for staff with ``fleet.view_costhour``.
- a batch: ``#batch[data-batch-id]``, ``#batch-body`` (refreshed while it runs)
  with ``#batch-summary``, ``#batch-status``, ``#batch-paused``,
  ``#batch-progress``, ``#batch-owner``, ``#batch-models``, ``#batch-files``,
  ``#batch-metadata``, ``#batch-validation-errors``, ``#batch-failed-lines``
  (``tr.failed-line[data-line]``).
"""
