from django.db import models

from portal.models.projects import Membership, Project


class GroupMappingRule(models.Model):
    """Maps an identity provider's group to a project membership, applied at each sign-in.

    `group` is a group name or a shell-style pattern (`gpu-*`, `lab-[ab]`), matched case-sensitively
    against the groups the OpenID provider's claim or the LDAP directory gives the user. A user
    matched by several rules for one project gets the highest role among them.
    """

    class Source(models.TextChoices):
        ANY = "any", "Any sign-in"
        OIDC = "oidc", "OpenID Connect"
        LDAP = "ldap", "LDAP"

    source = models.CharField(max_length=8, choices=Source.choices, default=Source.ANY)
    group = models.CharField(
        max_length=255, help_text="Group name, or a pattern with * ? [...] (e.g. gpu-*)."
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="group_rules")
    role = models.CharField(
        max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER
    )

    class Meta:
        ordering = ["project", "group", "source", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "group", "project"], name="%(app_label)s_%(class)s_unique_rule"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.group} -> {self.project} ({self.role})"
