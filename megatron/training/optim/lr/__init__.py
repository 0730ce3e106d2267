"""Learning-rate schedules, imported top to bottom without a circle:

| module     | what it holds                                                        |
| ---------- | -------------------------------------------------------------------- |
| `settings` | `ScheduleSettings`: what defines a curve (validated by the config's names) |
| `styles`   | the decay shapes (`DECAY_STYLES`, `WSD_TAILS`) and the warm-up        |
| `cycles`   | Levanter's LR cycles over those shapes                                |
| `schedule` | `AnnealingLR`, stepped by the engine; built from the config           |
"""
