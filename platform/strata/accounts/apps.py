from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "strata.accounts"
    label = "accounts"
