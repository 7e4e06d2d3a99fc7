"""The admin in a real Chromium over the live stack: the login form, then the pages an
operator opens first, each styled (its CSS loaded and in effect), with no console
error and no failed request, showing the node the live agent registered."""

from fleet.models import ApiKey, Model, Node


def test_an_operator_logs_in_through_the_admin_form(browser, live_fleet):
    # given: a browser with no session on this stack
    browser.use(live_fleet.url)
    browser.forget_cookies()
    browser.visit("/admin/")
    assert browser.path == "/admin/login/", "an anonymous visit is sent to the login form"
    browser.assert_styled()

    # when: the operator fills in the form
    browser.log_in(live_fleet.username, live_fleet.password)

    # then: the admin's index greets them, styled
    # (the CSS shows it in capitals; textContent is what the page says)
    greeted = browser.find("#user-tools strong").get_attribute("textContent")
    assert greeted == live_fleet.username
    browser.assert_styled()


def test_a_wrong_password_is_refused_on_the_styled_form(browser, live_fleet):
    browser.use(live_fleet.url)
    browser.forget_cookies()
    browser.visit("/admin/login/")
    browser.find("#id_username").send_keys(live_fleet.username)
    browser.find("#id_password").send_keys("not-the-password")
    browser.find("#login-form [type=submit]").click()

    browser.wait(lambda d: browser.find_all(".errornote"), "the form's error note")
    browser.check_page()
    assert browser.path == "/admin/login/"
    assert "correct username and password" in browser.text(".errornote")
    browser.assert_styled()


def test_the_admin_index_is_styled_and_lists_the_fleet(signed_in):
    signed_in.visit("/admin/")
    signed_in.assert_styled()
    links = {a.text for a in signed_in.find_all("#content-main a")}
    assert {"Nodes", "Models"} <= links, links
    # the header's links to the console's pages stand apart, not run together
    cluster, batches, costs = (
        signed_in.find(f"#nav-{n}").rect for n in ("cluster", "batches", "costs")
    )
    assert batches["x"] - (cluster["x"] + cluster["width"]) >= 8, (cluster, batches)
    assert costs["x"] - (batches["x"] + batches["width"]) >= 8, (batches, costs)
    signed_in.screenshot("admin-index")


def test_the_node_changelist_lists_the_live_agents_node(signed_in, live_fleet):
    signed_in.visit("/admin/fleet/node/")
    signed_in.assert_styled()
    rows = signed_in.find_all("#result_list tbody tr")
    assert [r.find_element("css selector", "th").text for r in rows] == [live_fleet.node_id]
    signed_in.screenshot("admin-nodes")


def test_the_node_change_page_shows_what_its_agent_reported(signed_in, live_fleet):
    node = Node.objects.get(pk=live_fleet.node_id)
    assert node.connected, "the live agent's node is connected"

    # when: the operator follows the node's link from the changelist
    signed_in.visit("/admin/fleet/node/")
    signed_in.find(f'#result_list a[href*="/{live_fleet.node_id}/change/"]').click()
    signed_in.wait_loaded()
    signed_in.check_page()

    # then: its own page, styled, names it
    assert signed_in.path == f"/admin/fleet/node/{live_fleet.node_id}/change/"
    signed_in.assert_styled()
    assert live_fleet.node_id in signed_in.text("#content")
    signed_in.screenshot("admin-node")


def test_the_model_changelist_lists_the_served_model(signed_in, live_fleet):
    model = Model.objects.get(name=live_fleet.model)

    signed_in.visit("/admin/fleet/model/")
    signed_in.assert_styled()
    names = [
        r.find_element("css selector", "th").text
        for r in signed_in.find_all("#result_list tbody tr")
    ]
    assert names == [live_fleet.model]

    # and its change page opens, styled
    signed_in.visit(f"/admin/fleet/model/{model.pk}/change/")
    signed_in.assert_styled()
    assert signed_in.find("#id_name").get_attribute("value") == live_fleet.model


def test_the_browsable_api_is_styled_for_a_logged_in_operator(signed_in, live_fleet):
    # The admin's session is good for DRF's browsable API: its Bootstrap loads from Daphne.
    signed_in.visit("/api/v1/nodes/")
    sheets = signed_in.stylesheets()
    bootstrap = [href for href in sheets if "/rest_framework/css/bootstrap" in href]
    assert bootstrap and sheets[bootstrap[0]] > 0, sheets
    assert live_fleet.node_id in signed_in.text(".response-info")


def test_the_api_docs_render_the_schema_from_our_own_static_files(signed_in):
    # Swagger UI's files come from Daphne (drf-spectacular-sidecar), not a CDN: the
    # page works offline, and a script fetched from elsewhere would fail the visit.
    signed_in.visit("/api/docs/")
    operations = signed_in.wait(
        lambda d: signed_in.find_all(".swagger-ui .opblock"), "the schema's operations"
    )
    assert any("/api/v1/nodes/" in op.text for op in operations)
    scripts = [s.get_attribute("src") for s in signed_in.find_all("script[src]")]
    assert scripts and all(src.startswith(signed_in.base_url + "/static/") for src in scripts)


def test_an_operator_mints_a_key_with_fallbacks_and_sees_its_secret_once(signed_in, live_fleet):
    signed_in.visit("/admin/fleet/apikey/add/")
    signed_in.assert_styled()
    signed_in.find("#id_name").send_keys("night batch")
    fallbacks = signed_in.find("#id_fallbacks")
    fallbacks.clear()
    fallbacks.send_keys(f'["{live_fleet.model}"]')
    signed_in.screenshot("admin-key-add")
    signed_in.find("input[name=_save]").click()
    signed_in.wait_loaded()
    signed_in.check_page()

    key = ApiKey.objects.get(name="night batch")
    assert key.fallbacks == [live_fleet.model]
    assert f"lgk_{key.prefix}_" in signed_in.text("#content")
    signed_in.screenshot("admin-key-secret")
