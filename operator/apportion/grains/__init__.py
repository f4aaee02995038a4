"""Worker side of GrainType placement: `PlacementDirector` places each new activation
in-process from the placement tables the operator publishes (docs/placement-table.md).

    director = PlacementDirector(local_member=os.environ["POD_NAME"])
    await director.start()                        # watches the namespace's tables
    member = director.place("Shop.CartGrain", "cart/42", hint=None)
    director.activated("Shop.CartGrain", "cart/42")   # when it runs here; deactivated() after
"""

from apportion.grains._director import GrainExplanation, NoPlacementTable, PlacementDirector

__all__ = ["GrainExplanation", "NoPlacementTable", "PlacementDirector"]
