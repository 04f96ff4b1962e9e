"""A member's chat URL (a Slack-compatible webhook URL is its own credential) is sealed at
rest: each stored URL is sealed here, bound to its row, and the clear column is dropped."""

from django.db import migrations, models

from checkpoints import crypto

# Frozen copies of approvals.services.preferences' binding: a migration must not follow
# later edits of the app's code.
TABLE, FIELD = "notification_preference", "chat_url"


def _scope(row):
    return {"tenant_id": row.tenant_id, "table": TABLE, "row_id": row.pk, "field": FIELD}


def seal(apps, schema_editor):
    Preference = apps.get_model("approvals", "NotificationPreference")
    for row in Preference.objects.exclude(chat_url="").only("pk", "tenant_id", "chat_url"):
        Preference.objects.filter(pk=row.pk).update(
            chat_url_sealed=crypto.seal(row.chat_url.encode(), **_scope(row))
        )


def unseal(apps, schema_editor):
    Preference = apps.get_model("approvals", "NotificationPreference")
    for row in Preference.objects.exclude(chat_url_sealed=""):
        Preference.objects.filter(pk=row.pk).update(
            chat_url=crypto.unseal(row.chat_url_sealed, **_scope(row)).decode()
        )


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0007_approve_with_edits"),
    ]

    operations = [
        migrations.AddField(
            model_name="notificationpreference",
            name="chat_url_sealed",
            field=models.TextField(blank=True),
        ),
        migrations.RunPython(seal, unseal),
        migrations.RemoveField(
            model_name="notificationpreference",
            name="chat_url",
        ),
    ]
