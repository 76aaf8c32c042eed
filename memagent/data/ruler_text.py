"""The fixed text of the RULER tasks (memagent/data/ruler.py): the noise haystack, the word lists keys and
values are drawn from, and the tasks' question templates, as RULER writes them."""

from __future__ import annotations

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

ADJECTIVES = """able acid aged airy ample angry antique apt arctic ashen azure bald bare basic bitter
blank bold brave brief bright brisk broad bronze busy calm candid cheap chief chilly civil clean clever
close cloudy coarse cold cosmic cozy crisp cruel curly cute damp daring dark dear deep dense dizzy dry
dull dusty eager early easy elder empty equal exact faint fair false famous fancy fast fierce final
firm flat fond fresh frosty funny fuzzy gentle giant glad global golden grand great green grim gusty
happy hardy hasty hazy heavy hidden hollow honest humble icy ideal idle jolly keen kind large lazy
lean light livid lone loud loyal lucky lunar mad magic major mellow mild misty modern moral muddy
narrow neat noble noisy odd olive open pale plain polite proud quick quiet rapid rare raw ready
rich rigid ripe rough round royal rusty sacred safe salty sandy scarce secret sharp shiny shy silent
silky simple sleek slim slow small smart smooth snowy soft solar solid sour spare stark steady steep
stiff stormy strict sunny sweet swift tall tame tender thick tidy tiny tough true urban vast vivid
warm weary wet white wide wild windy wise witty young zesty""".split()
NOUNS = """acorn anchor apple arrow badge bagel banjo barn basket beacon beetle bell bench bison
blossom bottle bridge brook bucket butter cabin cactus camel candle canoe canyon carpet castle cedar
cellar chalk cherry circus cliff clock cloud clover cobra comet coral cotton crane crater crayon
cricket crown dagger daisy desert dolphin donkey dragon drum eagle easel ember engine falcon fern
ferry fiddle flute forest fossil fountain fox galaxy garden garlic gazelle geyser ginger glacier
goblet goose granite guitar hammer harbor hazel helmet heron hill honey horizon island ivory jacket
jaguar jasmine kettle kite ladder lagoon lantern lemon lily lizard lobster locket magnet mango maple
marble meadow melon mirror mitten moose mosaic mountain mushroom needle nest oasis ocean olive onion
orchid otter owl paddle panther parrot pebble pepper piano pillow pine planet plum pony puzzle quartz
quill rabbit raven reef ribbon river robin rocket saddle salmon satchel shadow shell spider sponge
squirrel statue stone summit swan teapot thistle thunder tiger tulip turtle valley velvet violin
walnut walrus whale willow window wizard yacht zebra""".split()

QA_TEMPLATE = "Answer the question based on the given documents. {question}"
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
    "Question: Find all variables that are assigned the value {value} in the text above."
)
CWE_QUESTION = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\nQuestion: What are the 10 most common words in the above list?"
)
FWE_QUESTION = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words.\nQuestion: Do not provide any explanation. Please ignore the dots "
    "'....'. What are the three most frequently appeared words in the above coded text?"
)
