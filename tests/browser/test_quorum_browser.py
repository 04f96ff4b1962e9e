"""A quorum-2 request for a reviewer group, in a real browser: both group members get an
email from the loopback SMTP server, each opens the review page from its link (which decides
nothing), the page shows the quorum's progress as each approves, and a reviewer outside the
group is shown who decides instead of Approve and Reject."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ApprovalStatus
from tenants.services import Actor, member_set_role
from tests.approvals_support import deliver_all, legal_quorum_request
from tests.factories import UserFactory
from tests.smtp_support import PUBLIC_URL

pytestmark = pytest.mark.django_db(transaction=True)


def _reviewer(tenant, name: str):  # noqa: ANN001, ANN202
    user = UserFactory(username=name, email=f"{name}@example.org")
    member_set_role(tenant=tenant, user=user, role="reviewer", actor=Actor.system("test"))
    return user


def _link(smtp, address: str) -> str:  # noqa: ANN001
    (message,) = smtp.to(address)
    body = message.get_payload(decode=True).decode()
    return next(w for w in body.split() if w.startswith(PUBLIC_URL))[len(PUBLIC_URL) :]


def test_a_quorum_of_two_is_told_by_email_and_approves_on_the_review_page(
    live_server, page, login, smtp, settings, acme, alice, bob, carol
):  # noqa: ANN001
    settings.CAIRN_DISPATCH_ON_COMMIT = False  # no worker here: deliver_all() plays it
    rita, sam = _reviewer(acme, "rita"), _reviewer(acme, "sam")
    request = legal_quorum_request(acme, alice, bob, [rita, sam])
    deliver_all()
    assert sorted(r[0] for r, _ in smtp.messages) == ["rita@example.org", "sam@example.org"]

    login(page, rita)
    page.goto(live_server.url + _link(smtp, "rita@example.org"))
    expect(page.locator("#quorum-progress")).to_have_text("0 of 2")
    assert ApprovalRequest.objects.get(pk=request.pk).decisions.count() == 0  # the link
    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#quorum-progress")).to_contain_text("1 of 2; rita approved at ")

    page.context.clear_cookies()  # the next person, on the same machine
    login(page, carol)
    page.goto(f"{live_server.url}/approvals/{request.pk}/")
    expect(page.locator("#your-decision")).to_contain_text(
        "Only the reviewer group 'legal' decides this request, and you are not in it."
    )
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)

    page.context.clear_cookies()
    login(page, sam)
    page.goto(live_server.url + _link(smtp, "sam@example.org"))
    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#quorum-progress")).to_contain_text("2 of 2; rita approved at ")
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED
