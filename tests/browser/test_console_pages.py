"""The operator's console in a real Chromium over the live stack: the cluster page, the node
pages and the model pages (issue 12). Their tests go here once the pages exist.

This module's ``live_fleet`` is a stack of its own (a module-scoped fixture): Daphne,
a Celery worker and beat, the agent ``live_fleet.node_id`` and the model
``live_fleet.model`` ready on it and answering through the gateway
(``live_fleet.stack.openai()`` for load, ``live_fleet.agent`` for its processes).
``signed_in`` is the run's one Chromium, pointed at it and logged in as a superuser
through the admin's form.

A test visits with ``signed_in.visit(path)``, which fails on any console error or
failed request (a 404 on a static file included); the end of every test checks the
same again, so what a click or an in-place refresh loads is held to it too. Waits
poll with a deadline (``signed_in.wait(condition, what)``); nothing asserts a time.
``signed_in.assert_styled()`` proves the admin's CSS is in effect, and
``signed_in.screenshot("cluster")`` writes ``docs/img/cluster.png`` for the README
when ``LLMGW_SCREENSHOTS=1``. For example::

    def test_the_cluster_page_lists_the_node_with_its_bars(signed_in, live_fleet):
        signed_in.visit("/admin/cluster/")
        signed_in.assert_styled()
        row = signed_in.find(f'[data-node="{live_fleet.node_id}"]')
        ...
        signed_in.screenshot("cluster")
"""
