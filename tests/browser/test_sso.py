"""Single sign-on (fleet/sso.py) in a real Chromium against a real OpenID provider: the
test starts django-oauth-toolkit's provider (tests/processes/oidc_provider.py) and a web
process pointed at it. A person signs in there, lands on the cluster page with the
permissions of the group the provider names, and signing out ends both sessions."""

import urllib.parse

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from tests.processes import free_port, start_web
from tests.processes.oidc_provider import start_oidc_provider

pytestmark = pytest.mark.django_db(transaction=True)

PEOPLE = [
    {"username": "ana", "password": "ana-at-the-idp", "email": "ana@example.com",
     "groups": ["fleet-viewers", "idp-only-group"]},
    {"username": "bo", "password": "bo-at-the-idp", "email": "bo@example.com",
     "groups": ["sales"]},
]  # fmt: skip


@pytest.fixture
def sso(tmp_path):
    viewers = Group.objects.create(name="fleet-viewers")
    viewers.permissions.set(Permission.objects.filter(codename__in=["view_node", "view_model"]))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    idp = start_oidc_provider(tmp_path / "idp", PEOPLE, url)
    web = start_web(tmp_path, port=port, **idp.settings)
    yield url, idp
    web.stop()
    idp.stop()


def sign_in_at_the_provider(browser, idp, username: str, password: str) -> None:
    browser.wait(lambda d: d.current_url.startswith(idp.url), "the provider's login page")
    browser.wait_loaded()
    browser.find("#id_username").send_keys(username)
    browser.find("#id_password").send_keys(password)
    browser.find("#sign-in").click()


def test_a_person_signs_in_at_the_provider_and_lands_with_their_groups_permissions(browser, sso):
    url, idp = sso
    browser.use(url)
    browser.forget_cookies()

    # when: ana opens the admin and chooses single sign-on
    browser.visit("/admin/login/?next=/admin/cluster/")
    browser.screenshot("sso-login")
    browser.find("#sso-login").click()
    sign_in_at_the_provider(browser, idp, "ana", "ana-at-the-idp")

    # then: back on llmgw's cluster page, as ana
    browser.wait(lambda d: d.current_url.startswith(url + "/admin/cluster/"), "the cluster page")
    browser.wait_loaded()
    browser.check_page()
    assert browser.find("#user-tools strong").get_attribute("textContent") == "ana"
    browser.screenshot("sso-cluster")
    # with the provider's group that exists here, and its permissions only
    ana = get_user_model().objects.get(username="ana")
    assert [g.name for g in ana.groups.all()] == ["fleet-viewers"]
    assert ana.is_staff and not ana.is_superuser and not ana.has_usable_password()
    assert ana.has_perm("fleet.view_node") and not ana.has_perm("fleet.drain_node")
    browser.visit("/admin/fleet/node/")
    assert browser.path == "/admin/fleet/node/"

    # when: ana signs out of llmgw
    browser.find("#logout-form [type=submit]").click()

    # then: the provider's session ended too: the next sign-in asks for the password again
    browser.wait(lambda d: urllib.parse.urlsplit(d.current_url).path == "/admin/login/",
                 "the login page after signing out")  # fmt: skip
    browser.wait_loaded()
    browser.find("#sso-login").click()
    browser.wait(lambda d: d.current_url.startswith(idp.url), "the provider again")
    browser.wait_loaded()
    assert browser.find_all("#id_password"), "signed out at the provider: it asks again"
    browser.leave()


def test_someone_in_none_of_llmgws_groups_is_refused_and_a_local_account_is_not_taken(browser, sso):
    url, idp = sso
    get_user_model().objects.create_user("ana", password="break-glass", is_staff=True)
    browser.use(url)
    browser.forget_cookies()

    for who, password in (("bo", "bo-at-the-idp"), ("ana", "ana-at-the-idp")):
        browser.visit("/admin/login/")
        browser.find("#sso-login").click()
        sign_in_at_the_provider(browser, idp, who, password)
        browser.wait(lambda d: d.current_url.startswith(url + "/admin/login/"), "llmgw again")
        browser.wait_loaded()
        assert "llmgw does not know you" in browser.text("#sso-refused")
        browser.forget_cookies()

    assert not get_user_model().objects.filter(username="bo").exists()
    ana = get_user_model().objects.get(username="ana")
    assert ana.check_password("break-glass") and not ana.groups.exists()
    browser.leave()
