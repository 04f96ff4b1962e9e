"""The reviewer's decision form: the sha256 it displayed travels with the decision."""

from __future__ import annotations

from django import forms

from approvals.models import DecisionKind


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=DecisionKind.choices)
    artifact_sha256 = forms.CharField(max_length=200, widget=forms.HiddenInput)
    comment = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="Comment (required to reject)",
        help_text="Shown to the run's operators. A rejection needs one: it becomes the run's "
        "reason.",
    )

    # Approve with edits: the reviewer's edit of the text shown (a second form on the page
    # posts it). Not stripped: the bytes are stored as typed. A browser sends a textarea's
    # line ends as CRLF; ``line_endings`` says what the artifact used, so they are put back.
    edited_text = forms.CharField(required=False, strip=False, widget=forms.Textarea)
    line_endings = forms.ChoiceField(choices=[("lf", "LF"), ("crlf", "CRLF")], required=False)

    def edited(self, posted: bool) -> str | None:
        """The edited text as the artifact would hold it, or None without an edit."""
        if not posted:
            return None
        text = self.cleaned_data.get("edited_text") or ""
        if self.cleaned_data.get("line_endings") != "crlf":
            text = text.replace("\r\n", "\n")
        return text

    def clean(self) -> dict:
        data = super().clean()
        if data.get("decision") == "reject" and not (data.get("comment") or "").strip():
            # The service refuses it too; the form says so at the field, before any call.
            self.add_error(
                "comment",
                "Give a reason for the rejection: it is recorded with the decision and becomes "
                "the run's reason.",
            )
        return data


def mark_comment_invalid(form: DecisionForm, error: str) -> None:
    """Point the comment field at ``error``: aria-invalid, described by the error, focused."""
    form.comment_error = error
    form.fields["comment"].widget.attrs.update(
        {
            "aria-invalid": "true",
            "aria-describedby": "id_comment_error id_comment_helptext",
            "autofocus": True,
        }
    )


class PreferencesForm(forms.Form):
    """A reviewer's notification preferences. An empty chat URL keeps the one set; the
    "forget" box removes it."""

    email = forms.BooleanField(required=False, label="Email me when a request waits for me")
    chat = forms.BooleanField(required=False, label="Send a chat message too")
    chat_url = forms.CharField(
        required=False,
        max_length=500,
        label="Slack-compatible incoming-webhook URL",
        help_text="Leave empty to keep the URL already set.",
    )
    forget_chat_url = forms.BooleanField(required=False, label="Forget the chat URL")


class DelegationForm(forms.Form):
    delegate = forms.CharField(max_length=150, label="Reviewer who decides in your place")
    ends_at = forms.DateTimeField(
        label="Until (UTC)",
        help_text="e.g. 2026-12-24 18:00; at most 90 days from now.",
        widget=forms.DateTimeInput(attrs={"placeholder": "YYYY-MM-DD HH:MM"}),
    )
    reason = forms.CharField(required=False, max_length=4000, label="Reason (recorded)")
