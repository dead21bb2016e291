"""The quota admin in people's units: GPUs and MIG slices held as counted, durations in days and
hours, allowed models chosen among the site's models (the stored value stays a JSON list)."""

from django import forms

from portal.models import Quota
from portal.services.inventory.selectors import site_gpu_models
from portal.templatetags.portal_web import duration


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def limit_text(limit: float | None) -> str:
    """'of 16', or 'no limit' where there is none."""
    return "no limit" if limit is None else f"of {limit:g}"


def gpus_held_text(whole: int, slices: int, equivalents: float, limit: float | None) -> str:
    """'4 GPUs of 16', or with MIG slices '4 GPUs + 3 MIG slices, 4.4 GPU-equivalents, of 16'
    (a slice counts as its fraction of a GPU against the limit)."""
    held = _count(whole, "GPU")
    if not slices:
        return f"{held} {limit_text(limit)}" if limit is not None else f"{held}, no limit"
    return (
        f"{held} + {_count(slices, 'MIG slice')}, {round(equivalents, 1):g} GPU-equivalents, "
        f"{limit_text(limit)}"
    )


def hours_used_text(used: float, budget: float | None) -> str:
    """'3.0 of 100 GPU-hours', or '3.0 GPU-hours, no limit'."""
    if budget is None:
        return f"{used:.1f} GPU-hours, no limit"
    return f"{used:.1f} of {budget:g} GPU-hours"


def duration_text(seconds: int | None) -> str:
    """'3 d', '12 h', '1 d 6 h'; 'site maximum' where the quota sets none."""
    return "site maximum" if seconds is None else duration(seconds)


class _ModelChoices(forms.MultipleChoiceField):
    def to_python(self, value):
        # A blank value is no model (what the JSON field it replaces took for "all").
        return [name for name in super().to_python(value) if name]


class QuotaForm(forms.ModelForm):
    """A quota with its allowed models picked from the site's models instead of typed as JSON.

    Saved as the same list the field always held: nothing picked is "all models" (the stored
    empty value kept as it was), and an unchanged choice keeps its stored order."""

    allowed_models = _ModelChoices(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="GPU models this quota allows. None ticked: all.",
    )

    class Meta:
        model = Quota
        fields = [
            "project",
            "user",
            "max_gpus",
            "gpu_hours_budget",
            "budget_period_days",
            "max_duration_s",
            "allowed_models",
            "allowed_qos",
            "fairshare_shares",
            "borrowing",
            "max_borrow_gpus",
        ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = self.instance.allowed_models or []
        # A stored model the inventory no longer has stays a choice: saving must not drop it.
        names = site_gpu_models()
        names += [name for name in stored if name not in names]
        self.fields["allowed_models"].choices = [(name, name) for name in names]
        self.initial["allowed_models"] = list(stored)

    def clean_allowed_models(self):
        picked = self.cleaned_data["allowed_models"]
        stored = self.instance.allowed_models
        if not picked:
            return stored if not stored else None
        if stored and set(picked) == set(stored):
            return stored
        order = [name for name, _ in self.fields["allowed_models"].choices]
        return sorted(picked, key=order.index)
