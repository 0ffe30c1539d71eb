"""An order, written in the same transaction as the task that sends its receipt."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    email = models.EmailField()
    receipt_sent = models.BooleanField(default=False)

    class Meta:
        app_label = "shop"
