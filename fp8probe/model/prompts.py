"""Built-in prompts: short, varied tasks (math, code, reasoning, instructions, writing) written for fp8probe.

They exist so that a sweep can run with no data at hand. Rollouts are sampled from the student itself,
so what matters is that the prompts pull the student into the kinds of text RL and distillation train
on, not that they have reference answers.
"""

BUILTIN_PROMPTS: list[str] = [
    # math
    "What is 17 times 23? Show your steps.",
    "A train travels 180 km in 2.5 hours. What is its average speed in km per hour?",
    "Solve for x: 3x + 7 = 25.",
    "What is the sum of the first 20 positive integers?",
    "If a shirt costs 40 dollars and is discounted by 15 percent, what is the new price?",
    "Is 221 a prime number? Explain why or why not.",
    "Convert 3/8 to a decimal and to a percentage.",
    "A rectangle has a perimeter of 30 cm and a width of 5 cm. What is its area?",
    "What is the derivative of x squared plus 3x?",
    "Tom has 12 apples. He gives a third to Anna and half of the rest to Ben. How many does he keep?",
    # code
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain what a hash map is and when you would use one.",
    "Write a SQL query that counts the orders per customer in a table named orders.",
    "What does the following Python code print? for i in range(3): print(i * 2)",
    "Write a short bash command that counts the lines in every .txt file of a folder.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a JavaScript function that removes duplicates from an array.",
    # reasoning
    "All cats are animals. Some animals are black. Can we conclude that some cats are black? Explain.",
    "If it rains, the ground gets wet. The ground is wet. Did it rain? Explain your reasoning.",
    "Which is heavier, a kilogram of feathers or a kilogram of iron?",
    "Alice is older than Bob. Bob is older than Carol. Who is the youngest?",
    "A farmer has 17 sheep and all but 9 run away. How many are left?",
    "What comes next in the sequence 2, 4, 8, 16, and why?",
    "You have two coins that add up to 30 cents and one is not a nickel. What are they?",
    # instructions
    "Give three tips for staying focused while studying.",
    "Explain photosynthesis to a ten-year-old in a few sentences.",
    "List the steps to make a cup of tea.",
    "Summarize the water cycle in three sentences.",
    "Describe how to change a flat tire on a bicycle.",
    "What are the main differences between weather and climate?",
    "Give two arguments for and two against working from home.",
    # writing and knowledge
    "Write a haiku about the ocean.",
    "Write a short, polite email asking a colleague to review a document.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Translate into French: The weather is nice today.",
    "Who wrote Romeo and Juliet, and what is the play about?",
    "Explain why the sky is blue.",
    "Write a two-sentence story about a robot learning to paint.",
    "What is machine learning? Answer in one paragraph.",
]


# Training prompts for `fp8probe calibrate`: short instruction tasks made from templates and subjects (deterministic,
# 12 x 20 = 240). Forty hand-written prompts are too few to train on: a 30-step run saw each training prompt seven
# times and its held-out quality got worse after step 10 (measured on the demo pair), which is overfitting, not
# mismatch. Every tenth prompt is held out (calibrate.split_prompts), so the held-out prompts share templates with
# the training ones but not their (template, subject) pairs.
_TEMPLATES = [
    "Explain {s} to a ten-year-old in three sentences.",
    "Write a short poem about {s}.",
    "List three surprising facts about {s}.",
    "What are the main advantages and disadvantages of {s}?",
    "Write a one-paragraph story that involves {s}.",
    "Describe how {s} works, step by step.",
    "Give two examples of {s} in everyday life.",
    "Summarize the history of {s} in a few sentences.",
    "What questions would a scientist ask about {s}?",
    "Write a short dialogue between two friends arguing about {s}.",
    "How would you teach a beginner about {s}?",
    "Compare {s} with something similar and explain the difference.",
]
_SUBJECTS = [
    "photosynthesis",
    "the water cycle",
    "compound interest",
    "black holes",
    "the printing press",
    "vaccines",
    "recycling",
    "the internet",
    "volcanoes",
    "bees",
    "electric cars",
    "chess",
    "the moon",
    "sleep",
    "bread baking",
    "earthquakes",
    "solar panels",
    "the human heart",
    "maps",
    "rainbows",
]
TRAINING_PROMPTS: list[str] = [t.format(s=s) for s in _SUBJECTS for t in _TEMPLATES]
