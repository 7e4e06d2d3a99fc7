# Shard.restarts was never incremented: the reconciler restarts a replica by
# starting new shards, so the count lives on the replica and survives them.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0004_shard_spec'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='shard',
            name='restarts',
        ),
        migrations.AddField(
            model_name='replica',
            name='restarts',
            field=models.PositiveIntegerField(default=0, help_text='Times the reconciler restarted it after a shard failed, all told; never reset. Each restart starts new shards.'),
        ),
    ]
