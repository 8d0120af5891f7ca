"""What calibrates int8 quantization: each linear layer's input range per channel over a sample of model inputs
(`calibrate`), the inputs of a sample of texts (`calibration_batches`), and the texts when no data of the user's is
at hand (`--precision int8` of predict, evaluate, embed and serve): real English sentences, which reach the outlier
channels of a model's hidden states as the user's text does (random tokens miss most of them).

The sentences are public-domain text from the NLTK corpora: every 29th line of the US presidential inaugural
addresses and every 211th of the State of the Union addresses (1945-2006), those of 8 to 45 words that are not
headings: 32 in all.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.heads import every_position


@torch.inference_mode()
def calibrate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], names: Iterable[str]
              ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The smallest and largest input of each input channel of the named linear layers over `batches` (model
    inputs): name -> (low, high), each (in,)."""
    ranges: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(name):
        def hook(module, inputs):
            rows = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
            low, high = rows.amin(0), rows.amax(0)
            if name in ranges:
                low, high = torch.minimum(ranges[name][0], low), torch.maximum(ranges[name][1], high)
            ranges[name] = (low, high)
        return hook

    handles = [model.get_submodule(name).register_forward_pre_hook(record(name)) for name in names]
    was_training = model.training
    model.eval()
    try:
        with every_position(model):  # every token's range, so the model stays right wherever its layers are used
            for batch in batches:
                model(**batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    missing = [name for name in names if name not in ranges]
    if missing:
        raise ConfigError(f"calibration never reached {missing[0]}: no calibration batches?")
    return ranges


def calibration_batches(tokenizer, texts: Iterable[str] | None = None, batch_size: int = 16,
                        max_length: int = 128) -> list[dict[str, torch.Tensor]]:
    """Model inputs for `calibrate`: `texts` (default: CALIBRATION_SENTENCES)."""
    texts = list(CALIBRATION_SENTENCES if texts is None else texts)
    return [dict(tokenizer(texts[i:i + batch_size], max_length=max_length, padding=True, padding_side="right",
                           return_tensors="pt"))
            for i in range(0, len(texts), batch_size)]


CALIBRATION_SENTENCES = (
    'Fellow-Citizens of the Senate and of the House of Representatives:',
    ('They have retained as prisoners of war citizens of the United States not liable to be so considered '
     'under the usages of war.'),
    ('I do not consider it necessary at present for me to discuss those matters of administration about '
     'which there is no special anxiety or excitement.'),
    ('In furtherance of the reform we seek, and in other important respects a change of great importance, '
     'I recommend an amendment to the Constitution prescribing a term of six years for the Presidential '
     'office and forbidding a reelection.'),
    ('The lessons of paternalism ought to be unlearned and the better lesson taught that while the people '
     'should patriotically and cheerfully support their Government its functions do not include the '
     'support of the people.'),
    ('I stand here and have taken the high and solemn oath to which you have been audience because the '
     'people of the United States have chosen me for this august delegation of power and have by their '
     'gracious judgment named me their leader in affairs.'),
    "In Lincoln's day the task of the people was to preserve that Nation from disruption from within.",
    ("But if the spirit of America were killed, even though the Nation's body and mind, constricted in an "
     'alien world, lived on, the America we know would have perished.'),
    ('In addition, we must carry out our plans for reducing the barriers to world trade and increasing its'
     ' volume. Economic recovery and peace itself depend on increased world trade.'),
    ('We are aided by all who desire freedom of speech, freedom of religion, and freedom to live their own'
     ' lives for useful ends.'),
    ('Let both sides, for the first time, formulate serious and precise proposals for the inspection and '
     'control of arms -- and bring the absolute power to destroy other nations under the absolute control '
     'of all nations.'),
    ('Eight years from now America will celebrate its 200th anniversary as a nation. Within the lifetime '
     'of most people now living, mankind will celebrate that great new year which comes only once in a '
     'thousand years -- the beginning of the third millennium.'),
    ('We shall plan now for the day when our wealth can be transferred from the destruction of war abroad '
     'to the urgent needs of our people at home.'),
    'I know America. I know the heart of America is good.',
    ("Just as America's role is indispensable in preserving the world's peace, so is each nation's role "
     'indispensable in preserving its own peace.'),
    'We shall answer to God, to history, and to our conscience for the way in which we use these years.',
    ('These are not just my goals, and they will not be my accomplishments, but the affirmation of our '
     "Nation's continuing moral strength and our belief in an undiminished, ever-expanding American dream."),
    'And we are confident in principles that unite and lead us onward.',
    ('Americans are generous and strong and decent, not because we believe in ourselves, but because we '
     'hold beliefs beyond ourselves. When this spirit of citizenship is missing, no government program can'
     ' replace it. When this spirit is present, no wrong can stand against it.'),
    'Let me know in my heart when my days are through',
    ('The Economic Report, which I shall submit to the Congress shortly, will discuss in detail the '
     'economic background for these recommendations.'),
    'Seventh, housing and training of defense workers and the full use of all our manpower resources.',
    ('In the practical application of our foreign policy, we enter the field of foreign assistance and '
     'trade.'),
    'But I repeat, gratifying though this rate of progress is, we must still do more!',
    ('The image of America abroad is not improved when school children, through closing of some of our '
     'schools and through no fault of their own, are deprived of their opportunity for an education.'),
    'World affairs will continue to call upon our energy and our courage.',
    'We have launched new training programs to provide job skills for almost 1 million Americans.',
    ('I hope we can all agree that public service should never impose an unreasonable financial sacrifice '
     'on able men and women who want to serve their country.'),
    ('The way in which the 92d Congress answers these questions will determine its place in history. More '
     'importantly, it can determine this Nation¡¦s place in history as we enter the third century of our '
     'independence.'),
    ("In the 1940's we took the lead in creating the Atlantic Alliance in response to the Soviet Union's "
     'suppression and then consolidation of its East European empire and the resulting threat of the '
     'Warsaw Pact to Western Europe.'),
    ('There can be no economic revival in ghettos when the most violent among us are allowed to roam free.'
     " It's time we restored domestic tranquility. And we mean to do just that."),
    ('Good jobs also depend on reliable and affordable energy. This Congress must act to encourage '
     'conservation, promote technology, build infrastructure, and it must act to increase energy '
     'production at home so America is less dependent on foreign oil. (Applause.)'),
)
