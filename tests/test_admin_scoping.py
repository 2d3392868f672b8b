"""Admin scoping: a staff member sees and acts on only their organisations' objects."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from workflows.models import (
    ApiKey,
    Automation,
    AutomationVersion,
    Membership,
    Organisation,
    Run,
    Signal,
)
from workflows.services.automations import automation_publish_definition, version_create_draft
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .factories import IO_DEFINITION, OrganisationFactory, linear_definition

pytestmark = pytest.mark.django_db

ADMIN = "/admin/workflows"


@dataclass
class Tenant:
    org: Organisation
    automation: Automation
    published: AutomationVersion
    draft: AutomationVersion
    run: Run
    key: ApiKey


def make_tenant(slug: str) -> Tenant:
    org = OrganisationFactory.create(slug=slug, name=f"{slug.title()} Ltd")
    published = automation_publish_definition(
        org=org, slug=f"{slug}-flow", definition=IO_DEFINITION
    )
    draft = version_create_draft(automation=published.automation, definition=linear_definition("a"))
    started = run_start(org=org, automation_slug=f"{slug}-flow", run_input={}, start_key="k")
    key, _ = api_key_create(org=org, name=f"{slug} key")
    return Tenant(
        org, published.automation, published, draft, Run.objects.get(pk=started.run_id), key
    )


def staff_user(username: str, *orgs: Organisation) -> User:
    """A staff user with every permission on Waymark's models: only scoping limits them."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="workflows"))
    for org in orgs:
        Membership.objects.create(user=user, org=org)
    return user


@pytest.fixture
def mine() -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def theirs() -> Tenant:
    return make_tenant("globex")


@pytest.fixture
def member(mine: Tenant) -> User:
    return staff_user("ana", mine.org)


@pytest.fixture
def member_client(member: User) -> Client:
    client = Client()
    client.force_login(member)
    return client


def object_urls(tenant: Tenant) -> dict[str, str]:
    """The change page of each of the tenant's objects, one per scoped model."""
    return {
        "organisation": f"{ADMIN}/organisation/{tenant.org.pk}/change/",
        "apikey": f"{ADMIN}/apikey/{tenant.key.pk}/change/",
        "automation": f"{ADMIN}/automation/{tenant.automation.pk}/change/",
        "automationversion": f"{ADMIN}/automationversion/{tenant.published.pk}/change/",
        "draft": f"{ADMIN}/automationversion/{tenant.draft.pk}/change/",
        "run": f"{ADMIN}/run/{tenant.run.pk}/change/",
    }


def test_change_lists_show_only_the_members_organisations(
    member_client: Client, mine: Tenant, theirs: Tenant
) -> None:
    for model in ("organisation", "apikey", "automation", "automationversion", "run"):
        html = member_client.get(f"{ADMIN}/{model}/").content.decode()
        for name, url in object_urls(mine).items():
            if url.startswith(f"{ADMIN}/{model}/"):
                assert url in html, (model, name)
        for name, url in object_urls(theirs).items():
            assert url not in html, (model, name)
        assert "globex" not in html, model  # not even in a list filter


def test_another_organisations_objects_are_not_found_by_url(
    member_client: Client, mine: Tenant, theirs: Tenant
) -> None:
    for name, url in object_urls(mine).items():
        assert member_client.get(url).status_code == 200, name
    for name, url in object_urls(theirs).items():
        assert member_client.get(url).status_code == 404, name
        assert member_client.get(url.replace("/change/", "/history/")).status_code == 404, name
        assert member_client.get(url.replace("/change/", "/delete/")).status_code == 404, name


def test_posting_to_another_organisations_object_changes_nothing(
    member_client: Client, theirs: Tenant
) -> None:
    response = member_client.post(
        f"{ADMIN}/automation/{theirs.automation.pk}/change/", {"name": "taken over"}
    )
    assert response.status_code == 404
    response = member_client.post(f"{ADMIN}/apikey/{theirs.key.pk}/delete/", {"post": "yes"})
    assert response.status_code == 404
    theirs.automation.refresh_from_db()
    assert theirs.automation.name != "taken over"
    assert ApiKey.objects.filter(pk=theirs.key.pk).exists()


def test_foreign_key_choices_are_only_the_members_organisations(
    member_client: Client, mine: Tenant, theirs: Tenant
) -> None:
    for model in ("apikey", "automation"):
        html = member_client.get(f"{ADMIN}/{model}/add/").content.decode()
        assert f'<option value="{mine.org.pk}">' in html, model
        assert f'<option value="{theirs.org.pk}">' not in html, model

    response = member_client.post(
        f"{ADMIN}/apikey/add/", {"org": str(theirs.org.pk), "name": "smuggled"}
    )

    assert response.status_code == 200  # the form again, with its error
    assert "Select a valid choice" in response.content.decode()
    assert not ApiKey.objects.filter(name="smuggled").exists()


def test_actions_skip_another_organisations_objects(
    member_client: Client, mine: Tenant, theirs: Tenant
) -> None:
    member_client.post(
        f"{ADMIN}/apikey/",
        {"action": "revoke", "_selected_action": [str(mine.key.pk), str(theirs.key.pk)]},
    )
    member_client.post(
        f"{ADMIN}/automationversion/",
        {"action": "publish", "_selected_action": [str(theirs.draft.pk)]},
    )

    mine.key.refresh_from_db()
    theirs.key.refresh_from_db()
    theirs.draft.refresh_from_db()
    assert mine.key.revoked_at is not None
    assert theirs.key.revoked_at is None
    assert theirs.draft.published_at is None


def test_membership_is_checked_at_every_request(
    member_client: Client, member: User, mine: Tenant
) -> None:
    url = object_urls(mine)["run"]
    assert member_client.get(url).status_code == 200

    Membership.objects.filter(user=member).delete()

    assert member_client.get(url).status_code == 404
    assert f"/run/{mine.run.pk}/change/" not in member_client.get(f"{ADMIN}/run/").content.decode()


def test_a_member_of_both_sees_both(mine: Tenant, theirs: Tenant) -> None:
    client = Client()
    client.force_login(staff_user("both", mine.org, theirs.org))

    for tenant in (mine, theirs):
        for name, url in object_urls(tenant).items():
            assert client.get(url).status_code == 200, name


def test_a_superuser_sees_every_organisation(
    admin_client: Client, mine: Tenant, theirs: Tenant
) -> None:
    runs = admin_client.get(f"{ADMIN}/run/").content.decode()
    for tenant in (mine, theirs):
        assert object_urls(tenant)["run"] in runs
        for name, url in object_urls(tenant).items():
            assert admin_client.get(url).status_code == 200, name


def test_only_superusers_add_organisations_and_grant_memberships(
    member_client: Client, admin_client: Client, member: User, mine: Tenant, theirs: Tenant
) -> None:
    assert member_client.get(f"{ADMIN}/organisation/add/").status_code == 403
    assert member_client.get(f"{ADMIN}/membership/add/").status_code == 403
    response = member_client.post(
        f"{ADMIN}/membership/add/", {"user": str(member.pk), "org": str(theirs.org.pk)}
    )
    assert response.status_code == 403
    assert not Membership.objects.filter(user=member, org=theirs.org).exists()
    # Members see who is in their organisations, and nobody else.
    memberships = member_client.get(f"{ADMIN}/membership/").content.decode()
    assert "ana" in memberships

    response = admin_client.post(
        f"{ADMIN}/membership/add/", {"user": str(member.pk), "org": str(theirs.org.pk)}
    )
    assert response.status_code == 302
    assert Membership.objects.filter(user=member, org=theirs.org).exists()


def test_a_staff_user_without_memberships_sees_no_objects(mine: Tenant) -> None:
    client = Client()
    client.force_login(staff_user("nobody"))

    assert f"/run/{mine.run.pk}/change/" not in client.get(f"{ADMIN}/run/").content.decode()
    for name, url in object_urls(mine).items():
        assert client.get(url).status_code == 404, name


def test_only_superusers_reach_users_and_groups_whatever_their_permissions() -> None:
    staff = User.objects.create_user("mallory", password="pw-long-enough-1", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__endswith="_user"))
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/auth/user/").status_code == 403
    assert client.get(f"/admin/auth/user/{staff.pk}/change/").status_code == 403
    response = client.post(
        f"/admin/auth/user/{staff.pk}/change/",
        {"username": "mallory", "is_superuser": "on", "is_staff": "on", "is_active": "on",
         "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00"},
    )  # fmt: skip
    assert response.status_code == 403
    staff.refresh_from_db()
    assert not staff.is_superuser
    root = User.objects.create_superuser("root", password="pw-long-enough-2")
    client.force_login(root)
    assert client.get("/admin/auth/user/").status_code == 200


def test_unmatched_signals_are_shown_with_their_age_to_their_organisation_only(
    client, mine: Tenant, theirs: Tenant
) -> None:
    from workflows.engine.signals import deliver

    deliver(org_id=mine.org.pk, name="order.paid", correlation="mine-7")
    deliver(org_id=theirs.org.pk, name="order.paid", correlation="theirs-9")
    client.force_login(staff_user("ann", mine.org))
    page = client.get("/admin/workflows/signal/?status=pending")
    assert page.status_code == 200
    assert b"mine-7" in page.content and b"theirs-9" not in page.content
    assert b"pending" in page.content and b"minute" in page.content  # "0 minutes" old
    theirs_signal = Signal.objects.get(correlation="theirs-9")
    assert client.get(f"/admin/workflows/signal/{theirs_signal.pk}/change/").status_code == 404


def test_a_member_renames_the_organisation_but_never_changes_its_slug_nor_its_quotas(
    mine: Tenant, member_client: Client
) -> None:
    """The host's code names organisations by slug (@workflow(organisations=[...])): a
    member taking a slug listed there would start what only that organisation may."""
    answer = member_client.post(
        f"{ADMIN}/organisation/{mine.org.pk}/change/",
        {"slug": "vip-customer", "name": "Renamed Ltd", "quota_running_runs": "999999"},
    )
    assert answer.status_code == 302, answer.context["adminform"].form.errors
    mine.org.refresh_from_db()
    assert (mine.org.name, mine.org.slug, mine.org.quota_running_runs) == (
        "Renamed Ltd", "acme", None)  # fmt: skip
