"""The operator's console: cluster, node and model pages inside the admin.

Pages and the fragments that refresh them in place (``views``), charts drawn
as SVG on the server (``svg``); what they show comes from
``fleet.services.console`` and ``fleet.services.charts``. Templates are in
templates/console/, the stylesheet and the one small script in
fleet/static/fleet/. Add a page: a function in ``services.console`` that
reads in a fixed number of queries, a view here, a template extending
admin/base_site.html, and a test in tests/console/.
"""
