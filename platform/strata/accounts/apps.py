from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "strata.accounts"
    label = "accounts"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        from strata.accounts import node_tokens
        from strata.accounts.models import ApiToken

        # A token revoked or edited, or a user deactivated, in this process: its cached node tokens go at once
        # (other processes drop theirs within STRATA_NODE_TOKEN_CACHE_SECONDS).
        for model in (ApiToken, get_user_model()):
            post_save.connect(node_tokens.forget_all, sender=model, dispatch_uid=f"node-tokens-{model.__name__}")
            post_delete.connect(node_tokens.forget_all, sender=model,
                                dispatch_uid=f"node-tokens-del-{model.__name__}")
