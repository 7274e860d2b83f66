"""The team's secrets page (``/team/secrets/``): names and who set them, a set form with a password box, delete;
scoped to the viewer's own teams (another team is a 404) and never showing a value, not even back in a form that
failed."""

from __future__ import annotations

import pytest
from django.test import Client

from strata.accounts import team_secrets
from strata.accounts.models import Secret
from strata.accounts.services import membership_set

URL = "/team/secrets/"
VALUE = "page-secret-value-0123456789"


@pytest.fixture
def alpha(make_team):
    return make_team("alpha")


@pytest.fixture
def browser(make_user, alpha):
    client = Client()
    client.force_login(make_user("alice", alpha, "team-admin"))  # setting secrets: team-admin (roles)
    return client


def test_set_list_and_delete_without_ever_showing_a_value(browser, alpha):
    page = browser.get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'type="password"' in html and 'name="value"' in html and "No secrets yet" in html
    saved = browser.post(URL, {"team": "alpha", "action": "set", "name": "HF_TOKEN", "value": VALUE}, follow=True)
    assert saved.status_code == 200
    html = saved.content.decode()
    assert "Secret HF_TOKEN of alpha created" in html and 'data-secret="HF_TOKEN"' in html and VALUE not in html
    assert team_secrets.secret_values(alpha.pk, ["HF_TOKEN"])[0] == {"HF_TOKEN": VALUE}
    replaced = browser.post(URL, {"team": "alpha", "action": "set", "name": "HF_TOKEN", "value": VALUE + "2"},
                            follow=True).content.decode()
    assert "replaced" in replaced and VALUE not in replaced
    deleted = browser.post(URL, {"team": "alpha", "action": "delete", "name": "HF_TOKEN"}, follow=True)
    assert "Secret HF_TOKEN of alpha deleted" in deleted.content.decode()
    assert not Secret.objects.exists()


def test_a_bad_form_names_each_field_and_does_not_type_the_value_back(browser):
    answer = browser.post(URL, {"team": "alpha", "action": "set", "name": "PATH", "value": VALUE})
    assert answer.status_code == 400
    html = answer.content.decode()
    assert 'data-field="name"' in html and VALUE not in html
    empty = browser.post(URL, {"team": "alpha", "action": "set", "name": "lower", "value": ""}).content.decode()
    assert 'data-field="name"' in empty and 'data-field="value"' in empty
    assert not Secret.objects.exists()


def test_another_team_is_a_404_and_an_admin_sees_only_their_own_teams(browser, make_team, make_user, alpha):
    beta = make_team("beta")
    team_secrets.secret_set(beta, "BETA_KEY", "beta-value-123")
    assert browser.get(URL, {"team": "beta"}).status_code == 404
    assert browser.post(f"{URL}?team=beta", {"action": "delete", "name": "BETA_KEY"}).status_code == 404
    assert browser.post(URL, {"team": "beta", "action": "set", "name": "X_KEY", "value": "x" * 8}).status_code == 404
    assert Secret.objects.filter(team=beta).count() == 1
    admin = Client()
    root = make_user("root", admin=True)
    admin.force_login(root)
    assert admin.get(URL, {"team": "beta"}).status_code == 404
    assert "not a member of any team" in admin.get(URL).content.decode()
    membership_set(root, beta)
    html = admin.get(URL).content.decode()
    assert 'data-secret="BETA_KEY"' in html and "beta-value-123" not in html
    assert Client().get(URL).status_code == 302  # anonymous: the login page
