"""The synthetic dataset's label vocabulary and CSV columns, shared by the video writer
(``synthetic``) and the narration writer (``synthetic_text``)."""

VERB_NAMES = ("move-up", "move-down", "grow", "shrink", "move-left", "move-right", "orbit", "stay")
NOUN_NAMES = ("circle", "square", "triangle", "diamond", "cross", "ring", "bar", "plus")

EPIC_COLUMNS = (
    "narration_id",
    "participant_id",
    "video_id",
    "narration_timestamp",
    "start_timestamp",
    "stop_timestamp",
    "start_frame",
    "stop_frame",
    "narration",
    "verb",
    "verb_class",
    "noun",
    "noun_class",
)
