"""Instruction-, code- and chat-style prompts written as templates for the self-distillation campaign.

Each template has slots filled from small word lists; `template_prompts(n, seed)` draws `n` distinct
prompts. The point is breadth: the drafts should learn how the model answers everyday requests, not
only maths. None of these is a held-out question (those are gsm_symbolic's test split, HumanEval and the
reasoning-gym tasks gcd, chain_sum, count_primes, word_ladder and number_sorting).
"""

from __future__ import annotations

import random

TOPICS = ["photosynthesis", "gravity", "the water cycle", "inflation", "compound interest", "vaccines",
          "the internet", "black holes", "climate change", "machine learning", "democracy", "the French Revolution",
          "plate tectonics", "the immune system", "electricity", "recycling", "supply and demand", "DNA",
          "the moon's phases", "volcanoes", "rainbows", "the stock market", "sleep", "exercise", "bees",
          "the Roman Empire", "renewable energy", "blockchain", "friction", "evolution", "the printing press",
          "ocean tides", "magnets", "the human heart", "antibiotics", "cloud computing", "encryption",
          "the solar system", "earthquakes", "nutrition", "time zones", "the Olympic Games", "coral reefs",
          "memory", "taxes", "the Silk Road", "batteries", "sound waves", "glaciers", "social media"]
AUDIENCES = ["a five-year-old", "a high school student", "a busy manager", "a beginner", "my grandmother",
             "a software engineer", "a curious teenager", "someone who has never heard of it"]
ACTIVITIES = ["learning a new language", "saving money", "running a first marathon", "starting a garden",
              "studying for exams", "cooking for a family", "working from home", "public speaking",
              "moving to a new city", "reading more books", "learning to code", "staying focused",
              "planning a trip", "keeping a houseplant alive", "sleeping better", "writing a novel",
              "training a puppy", "making new friends", "preparing for a job interview", "decluttering a home"]
THINGS = ["a bicycle", "a smartphone", "a library", "a river", "a city at night", "an old clock", "a forest",
          "a robot", "a cup of coffee", "a thunderstorm", "a mountain village", "a train station", "a lighthouse",
          "a school", "a spaceship", "a market", "a garden in spring", "the ocean", "a castle", "a snowy morning"]
FORMS = ["a short poem", "a haiku", "a limerick", "a two-sentence story", "a short story", "a product description",
         "a slogan", "a riddle", "a diary entry", "a tweet"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
              "counts the vowels in a string", "removes duplicates from a list while keeping order",
              "finds the largest element of a list", "merges two sorted lists", "computes the factorial of n",
              "checks whether a string is a palindrome", "converts Celsius to Fahrenheit",
              "returns the sum of the digits of an integer", "flattens a nested list",
              "counts how often each word appears in a text", "returns the second largest number in a list",
              "checks whether two strings are anagrams", "computes the average of a list of numbers",
              "capitalizes the first letter of every word", "returns all even numbers from a list",
              "finds the greatest common divisor of two numbers", "converts a binary string to an integer",
              "rotates a list by k positions", "checks whether brackets in a string are balanced",
              "returns the index of a value in a sorted list using binary search", "transposes a matrix",
              "computes the running total of a list", "splits a list into chunks of size n",
              "returns the longest word in a sentence", "checks whether a year is a leap year",
              "counts the number of lines in a file", "reads a CSV file and returns the rows as dictionaries",
              "validates an email address with a regular expression", "sorts a list of dictionaries by a key",
              "returns the intersection of two lists", "converts a Roman numeral to an integer",
              "generates all permutations of a string", "computes the dot product of two vectors"]
LANGUAGES = ["Python", "JavaScript", "Java", "C", "Go", "Rust", "C++", "Ruby", "TypeScript", "Bash"]
CONCEPTS = ["recursion", "a hash table", "object-oriented programming", "a linked list", "big-O notation",
            "a closure", "an API", "version control with git", "a race condition", "garbage collection",
            "a REST API", "unit testing", "a binary search tree", "dynamic programming", "a stack and a queue",
            "exceptions", "a compiler", "an operating system", "a database index", "SQL joins"]
PEOPLE = ["my boss", "a friend", "my landlord", "a customer", "my teacher", "a colleague", "my neighbour"]
REASONS = ["to ask for a day off", "to apologise for being late", "to thank them for their help",
           "to decline an invitation politely", "to ask for feedback", "to follow up on a meeting",
           "to report a problem", "to congratulate them on a promotion", "to request a refund",
           "to invite them to a party"]
COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Egypt", "India", "Italy", "Kenya", "Mexico", "Norway",
             "Australia", "Germany", "Spain", "Vietnam", "Peru", "Greece", "Turkey", "Morocco"]
FOODS = ["pancakes", "tomato soup", "a vegetable curry", "banana bread", "a green salad", "fried rice",
         "lemonade", "guacamole", "chocolate chip cookies", "a simple pasta sauce", "scrambled eggs", "hummus"]
CHAT_OPENERS = ["Hi! How are you today?", "Can you help me with something?", "I'm bored. Any ideas?",
                "What's your favourite book and why?", "Tell me a fun fact.", "What can you do?",
                "I had a rough day at work.", "Do you like music?", "What should I name my cat?",
                "Can you tell me a joke?", "I can't decide what to eat tonight.", "Give me a random question to think about.",
                "What is the meaning of life?", "How do I become more productive?", "Who are you?"]

TEMPLATES = [
    ("instruction", "Explain {topic} to {audience}."),
    ("instruction", "What is {topic}? Answer in three sentences."),
    ("instruction", "Give me three tips for {activity}."),
    ("instruction", "List five facts about {topic}."),
    ("instruction", "What are the pros and cons of {activity}?"),
    ("instruction", "Write {form} about {thing}."),
    ("instruction", "Describe {thing} in one paragraph."),
    ("instruction", "Summarize the main ideas of {topic} in a few bullet points."),
    ("instruction", "Write an email to {person} {reason}."),
    ("instruction", "What is the capital of {country}, and what is it known for?"),
    ("instruction", "How do I make {food}? Give the steps."),
    ("instruction", "Compare {topic} and {topic2} in a short paragraph."),
    ("instruction", "Write a short plan for {activity} over the next month."),
    ("instruction", "Give me a quiz of three questions about {topic}, with answers."),
    ("instruction", "Name three common mistakes people make when {activity}."),
    ("instruction", "Tell me about the culture and food of {country}."),
    ("code", "Write a {language} function that {code_task}."),
    ("code", "Write a Python function that {code_task}. Include a docstring and an example."),
    ("code", "Explain {concept} with a short {language} example."),
    ("code", "What is the difference between {concept} and {concept2}?"),
    ("code", "How would you test a function that {code_task}?"),
    ("code", "Write a {language} program that {code_task}, and explain how it works."),
    ("code", "What is the time complexity of a function that {code_task}? Explain."),
    ("chat", "{opener}"),
    ("chat", "{opener} Also, I'm interested in {topic}."),
    ("chat", "I want to start {activity}. Where should I begin?"),
    ("chat", "My friend says {topic} is boring. How can I convince them otherwise?"),
    ("chat", "I'm travelling to {country} next month. What should I pack?"),
    ("chat", "Can you recommend something to cook tonight? I like {food}."),
]

SLOTS = {"topic": TOPICS, "topic2": TOPICS, "audience": AUDIENCES, "activity": ACTIVITIES, "thing": THINGS,
         "form": FORMS, "code_task": CODE_TASKS, "language": LANGUAGES, "concept": CONCEPTS, "concept2": CONCEPTS,
         "person": PEOPLE, "reason": REASONS, "country": COUNTRIES, "food": FOODS, "opener": CHAT_OPENERS}


def template_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` distinct (source, prompt) pairs; source is "template-instruction", "template-code" or
    "template-chat". Fewer if the templates cannot make that many distinct prompts."""
    rng = random.Random(seed)
    seen, out = set(), []
    for _ in range(50 * n):
        if len(out) == n:
            break
        kind, text = TEMPLATES[rng.randrange(len(TEMPLATES))]
        values = {k: rng.choice(v) for k, v in SLOTS.items() if "{" + k + "}" in text}
        if values.get("topic") is not None and values.get("topic") == values.get("topic2"):
            continue
        if values.get("concept") is not None and values.get("concept") == values.get("concept2"):
            continue
        prompt = text.format(**values)
        if prompt not in seen:
            seen.add(prompt)
            out.append((f"template-{kind}", prompt))
    return out
