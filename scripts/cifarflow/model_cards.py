"""What the workflow knows of each model, in one place: one card per registered model (its
factory in engine/models.py, what ``train.augment: auto`` means for it, the bytes of its
parameters and buffers for the storage estimate), and the card of a user's
``package.module:factory`` model, measured where the plan builds it (check_user_models).
The controller reads the cards without importing torch; tests/unit/test_model_cards.py
holds each card to the model its factory builds. No torch here.

A model of your own trains without augmentation under ``train.augment: auto`` (the plan
does not import it to ask, as every job builds the plan again): set ``train.augment``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# train.augment without augmentation: the seed trains so, and so does a model that says
# nothing of its own
NO_AUGMENT = {"flip": False, "crop": 0}


@dataclass(frozen=True)
class ModelCard:
    name: str
    factory: str  # package.module:attribute, imported only where the model is built
    augment: dict = field(default_factory=lambda: dict(NO_AUGMENT))
    param_bytes: int | None = None   # float32, as built with no model_args; None: unknown
    buffer_bytes: int | None = None
    about: str = ""

    @property
    def sizes(self) -> tuple[int, int] | None:
        """(parameter bytes, buffer bytes), where known."""
        if self.param_bytes is None:
            return None
        return self.param_bytes, self.buffer_bytes or 0


# The seed's LeNet trains without augmentation (the seed does, and the comparison with it
# stays fair); ResNet-18 with flips and 4-pixel translations (kuangliu/pytorch-cifar's
# RandomCrop(32, padding=4) + RandomHorizontalFlip); fastnet with flips and 2-pixel
# translations (airbench94's recipe, arXiv 2404.00498).
CARDS = {card.name: card for card in (
    ModelCard("lenet", "cifarflow.engine.models:Net", {"flip": False, "crop": 0},
              248_024, 0, "the seed's LeNet, layer for layer (62k parameters)"),
    ModelCard("resnet18", "cifarflow.engine.models:resnet18", {"flip": True, "crop": 4},
              44_695_848, 38_560, "torchvision's ResNet-18 for 32x32 inputs (11.2M)"),
    ModelCard("fastnet", "cifarflow.engine.models:FastNet", {"flip": True, "crop": 2},
              7_891_168, 9_264, "airbench94's network (1.97M)"),
)}


def card_of(model: str) -> ModelCard:
    """A registered model's card; a user's model's, as known without importing it."""
    return CARDS.get(model) or ModelCard(model, model)


def user_card(name: str, built) -> ModelCard:
    """The card of a user's ``package.module:factory`` model, with the sizes of the model
    it built (an nn.Module)."""
    return ModelCard(name, name,
                     param_bytes=sum(p.numel() * p.element_size() for p in built.parameters()),
                     buffer_bytes=sum(b.numel() * b.element_size() for b in built.buffers()))
