"""A runner webhook's URL is sealed at rest (some receivers put a token in it, so it is a
credential of its own): each stored URL is sealed here, bound to its tenant, and the clear
column is dropped."""

from django.db import migrations, models

from checkpoints import crypto

# Frozen copies of checkpoints.services.keys' binding: a migration must not follow later
# edits of the app's code.
TABLE, FIELD = "runner_webhook", "url"


def _scope(row):
    return {"tenant_id": row.tenant_id, "table": TABLE, "row_id": row.tenant_id, "field": FIELD}


def seal(apps, schema_editor):
    Webhook = apps.get_model("checkpoints", "RunnerWebhook")
    for row in Webhook.objects.only("tenant_id", "url"):
        Webhook.objects.filter(pk=row.pk).update(
            url_sealed=crypto.seal(row.url.encode(), **_scope(row))
        )


def unseal(apps, schema_editor):
    Webhook = apps.get_model("checkpoints", "RunnerWebhook")
    for row in Webhook.objects.only("tenant_id", "url_sealed"):
        Webhook.objects.filter(pk=row.pk).update(
            url=crypto.unseal(row.url_sealed, **_scope(row)).decode()
        )


class Migration(migrations.Migration):
    dependencies = [
        ("checkpoints", "0017_run_latest_checkpoint_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="runnerwebhook",
            name="url_sealed",
            field=models.TextField(default=""),
            preserve_default=False,
        ),
        migrations.RunPython(seal, unseal),
        migrations.RemoveField(
            model_name="runnerwebhook",
            name="url",
        ),
    ]
