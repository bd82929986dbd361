"""Only what a reader sees is graded, however it is hidden: colours in any spelling, conditionals' dead branches,
text after ``\\end{document}``, zero scaling, HTML hidden by style, Markdown comments, and the percent sign
after a number, which never lets a later answer through (docs/grading.md, "How a completion is read", step 0).

Every case here that hides an 8 was graded correct for 8 by the grader before this change (main 0298207); the
property test at the end generates hidden-content wrappers around a wrong visible answer and a right hidden one.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sage_unsloth.grading import grade, judge
from sage_unsloth.grading.colours import WHITE, contrast, css_colour, latex_colour, readable
from sage_unsloth.grading.visible import visible
from sage_unsloth.rlvr.reward import correctness_reward

HIDDEN_EIGHT = {
    # colours that make text invisible on a white page, whatever their spelling
    "color declaration in a group": "\\boxed{3} {\\color{white} \\boxed{8}}",
    "color declaration to the end": "\\boxed{3} \\color{white} \\boxed{8}",
    "textcolor rgb": "\\boxed{3} \\textcolor[rgb]{1,1,1}{\\boxed{8}}",
    "textcolor RGB": "\\boxed{3} \\textcolor[RGB]{255,255,255}{\\boxed{8}}",
    "textcolor HTML": "\\boxed{3} \\textcolor[HTML]{FFFFFF}{\\boxed{8}}",
    "textcolor cmyk": "\\boxed{3} \\textcolor[cmyk]{0,0,0,0}{\\boxed{8}}",
    "textcolor gray": "\\boxed{3} \\textcolor[gray]{1}{\\boxed{8}}",
    "textcolor mix": "\\boxed{3} \\textcolor{white!100}{\\boxed{8}}",
    "textcolor mix of black": "\\boxed{3} \\textcolor{black!3}{\\boxed{8}}",
    "textcolor two-colour mix": "\\boxed{3} \\textcolor{white!97!black}{\\boxed{8}}",
    "textcolor complement": "\\boxed{3} \\textcolor{-black}{\\boxed{8}}",
    "textcolor dvipsnames": "\\boxed{3} \\textcolor{White}{\\boxed{8}}",
    "textcolor yellow": "\\boxed{3} \\textcolor{Yellow}{\\boxed{8}}",
    "textcolor without braces": "\\boxed{3} \\textcolor{white} 8",
    "textcolor unknown name": "\\boxed{3} \\textcolor{paper}{\\boxed{8}}",
    "definecolor": "\\boxed{3} \\definecolor{ink}{rgb}{1,1,1}\\textcolor{ink}{\\boxed{8}}",
    "colorlet": "\\boxed{3} \\colorlet{ink}{white}{\\color{ink}\\boxed{8}}",
    "colorbox black": "\\boxed{3} \\colorbox{black}{\\boxed{8}}",
    "colorbox same colour": "\\boxed{3} \\colorbox{red}{\\color{red}\\boxed{8}}",
    "fcolorbox": "\\boxed{3} \\fcolorbox{red}{black}{\\boxed{8}}",
    "pagecolor": "\\boxed{3} \\pagecolor{black} \\boxed{8}",
    "color in math": "\\boxed{3} $\\color{white}\\boxed{8}$",
    "transparent": "\\boxed{3} {\\transparent{0} \\boxed{8}}",
    # dead branches and the end of the document
    "else of iftrue": "\\boxed{3} \\iftrue \\else \\boxed{8} \\fi",
    "unless": "\\boxed{3} \\unless\\iftrue \\boxed{8} \\fi",
    "nested iffalse": "\\boxed{3} \\iftrue x \\iffalse \\boxed{8} \\fi \\fi",
    "unevaluated test": "\\boxed{3} \\ifnum1=1 \\boxed{8} \\fi",
    "conditional macro": "\\boxed{3} \\ifthenelse{1=1}{}{\\boxed{8}}",
    "after end document": "\\boxed{3} \\end{document} \\boxed{8}",
    # zero scaling, invisible and unrendered boxes, off the page
    "scalebox 0": "\\boxed{3} \\scalebox{0}{\\boxed{8}}",
    "scalebox tiny": "\\boxed{3} \\scalebox{0.01}[1]{\\boxed{8}}",
    "resizebox 0pt": "\\boxed{3} \\resizebox{0pt}{!}{\\boxed{8}}",
    "resizebox height": "\\boxed{3} \\resizebox{!}{0.5pt}{\\boxed{8}}",
    "fontsize 0": "\\boxed{3} {\\fontsize{0}{0}\\selectfont \\boxed{8}}",
    "raisebox off the page": "\\boxed{3} \\raisebox{100cm}{\\boxed{8}}",
    "hspace off the page": "\\boxed{3} \\hspace{2000pt} \\boxed{8}",
    "kern off the page": "\\boxed{3} \\kern-5000pt \\boxed{8}",
    "sbox": "\\boxed{3} \\sbox{\\mybox}{\\boxed{8}}",
    "label": "\\boxed{3} \\label{\\boxed{8}}",
    "beamer invisible": "\\boxed{3} \\invisible<1>{\\boxed{8}}",
    "mathjax style": "\\boxed{3} \\style{display:none}{\\boxed{8}}",
    # HTML hidden by style, attribute or element
    "display none": '\\boxed{3} <span style="display:none">\\boxed{8}</span>',
    "visibility hidden": '\\boxed{3} <div style="visibility: hidden">\\boxed{8}</div>',
    "css white": '\\boxed{3} <span style="color:#fff">\\boxed{8}</span>',
    "css transparent": '\\boxed{3} <span style="color: rgba(0, 0, 0, 0)">\\boxed{8}</span>',
    "css hsl white": '\\boxed{3} <span style="color:hsl(0, 0%, 100%)">\\boxed{8}</span>',
    "css font size 0": '\\boxed{3} <span style="font-size:0">\\boxed{8}</span>',
    "css opacity": '\\boxed{3} <span style="opacity:0.02">\\boxed{8}</span>',
    "css off screen": '\\boxed{3} <span style="position:absolute;left:-9999px">\\boxed{8}</span>',
    "css zero height": '\\boxed{3} <span style="height:0;overflow:hidden">\\boxed{8}</span>',
    "font color": '\\boxed{3} <font color="white">\\boxed{8}</font>',
    "hidden attribute": "\\boxed{3} <p hidden>\\boxed{8}</p>",
    "class": '\\boxed{3} <span class="sr-only">\\boxed{8}</span>',
    "closed details": "\\boxed{3} <details><summary>why</summary>\\boxed{8}</details>",
    "template": "\\boxed{3} <template>\\boxed{8}</template>",
    "attribute": '\\boxed{3} <span title="\\boxed{8}">note</span>',
    "unclosed hidden element": '\\boxed{3} <div style="display:none">\\boxed{8}',
    # Markdown comments (link reference definitions)
    "markdown comment": "\\boxed{3}\n[//]: # (\\boxed{8})",
    "markdown comment angle": "\\boxed{3}\n[comment]: <> (\\boxed{8})",
    "markdown comment quoted": '\\boxed{3}\n[//]: # "\\boxed{8}"',
    "markdown comment over lines": "\\boxed{3}\n[//]: # (\n\\boxed{8}\n)",
    "markdown title next line": '\\boxed{3}\n[x]: #\n"\\boxed{8}"',
    # the percent sign after a number never lets a later answer through
    "percent then box": "\\boxed{3} 1% \\boxed{8}",
    "percent in a box": "\\boxed{3} \\boxed{1 % } \\boxed{8}",
    "percent after math": "\\boxed{3} $1$ % \\boxed{8}",
    "percent then statement": "\\boxed{3} 50% of it: the answer is 8",
    "percent then block": "<SOLUTION>3</SOLUTION> 5% <SOLUTION>8</SOLUTION>",
}


@pytest.mark.parametrize("completion", list(HIDDEN_EIGHT.values()), ids=list(HIDDEN_EIGHT))
def test_a_hidden_answer_is_never_paid(completion):
    assert grade(completion, "8").status != "correct", completion
    assert grade(completion, "3").status == "correct", completion  # the visible answer is still read


REFUSED = {
    "a redefined command": "\\boxed{3} \\renewcommand{\\x}[1]{} \\x{\\boxed{8}}",
    "a TeX definition": "\\boxed{3} \\def\\x#1{} \\x{\\boxed{8}}",
    "a redefined box": "\\renewcommand{\\boxed}[1]{3} \\boxed{8}",
    "a style sheet": "\\boxed{3} <style>.x{display:none}</style><span class=x>\\boxed{8}</span>",
    "a script": "\\boxed{3} <script>hide()</script> \\boxed{8}",
    "a bidi override": "\\boxed{3} \u202e\\boxed{8}\u202c",
}


@pytest.mark.parametrize("completion", list(REFUSED.values()), ids=list(REFUSED))
def test_a_completion_that_can_render_as_anything_has_no_answer(completion):
    assert grade(completion, "8").status == "no_answer"
    assert grade(completion, "3").status == "no_answer"


SHOWN = {
    "a visible colour": ("\\textcolor{red}{\\boxed{8}}", "8"),
    "a visible declaration": ("{\\color{blue} \\boxed{8}}", "8"),
    "green (CSS lime) is read": ("\\textcolor[HTML]{00FF00}{\\boxed{8}}", "8"),
    "a 20% tint is read": ("\\textcolor{black!20}{\\boxed{8}}", "8"),
    "a dark box": ("\\colorbox{yellow}{\\boxed{8}}", "8"),
    "white on black": ("\\textcolor{white}{\\colorbox{black}{\\boxed{8}}}", "8"),
    "a declaration ends with its math": ("$\\color{white}x$ and \\boxed{8}", "8"),
    "an ordinary space": ("\\hspace{1cm}\\boxed{8}", "8"),
    "a thin negative space": ("\\boxed{8\\mkern-3mu}", "8"),
    "a live branch": ("\\iftrue \\boxed{8}\\fi", "8"),
    "the else of iffalse": ("\\iffalse \\boxed{3} \\else \\boxed{8} \\fi", "8"),
    "iff is a symbol": ("$x \\iff y$ so \\boxed{8}", "8"),
    "a readable scale": ("\\scalebox{0.8}{\\boxed{8}}", "8"),
    "a readable resize": ("\\resizebox{2cm}{!}{\\boxed{8}}", "8"),
    "bold HTML": ("<b>\\boxed{8}</b>", "8"),
    "a harmless style": ('<span style="color:red; font-weight:bold">\\boxed{8}</span>', "8"),
    "an open details": ("<details open>\\boxed{8}</details>", "8"),
    "a summary": ("<details><summary>\\boxed{8}</summary>why</details>", "8"),
    "a comparison, not a tag": ("a<b and \\boxed{8}", "8"),
    "a percent sign before the only answer": ("The rate is 5% so \\boxed{20}", "20"),
    "a percent sign in the answer": ("\\boxed{50%}", "50"),
    "a link": ("see [the notes](#n) \\boxed{8}", "8"),
}


@pytest.mark.parametrize("completion, gold", list(SHOWN.values()), ids=list(SHOWN))
def test_what_a_reader_sees_is_read(completion, gold):
    assert grade(completion, gold).status == "correct", completion


def test_the_reward_and_the_judge_read_as_shown():
    completions = [HIDDEN_EIGHT["textcolor rgb"], HIDDEN_EIGHT["display none"], "\\boxed{8}"]
    assert correctness_reward(prompts=["p"] * 3, completions=completions, answer=["8"] * 3) == [0.0, 0.0, 1.0]
    assert judge("3 \\textcolor{white}{8}", "3") == "correct"
    assert judge("3 \\textcolor{white}{8}", "38") == "wrong"


def test_colours_are_read_in_every_spelling():
    """Against values written from the xcolor manual and the CSS colour specification."""
    for spec, model in [("white", None), ("White", None), ("1,1,1", "rgb"), ("255,255,255", "RGB"),
                        ("FFFFFF", "HTML"), ("1", "gray"), ("15", "Gray"), ("0,0,0,0", "cmyk"), ("0,0,0", "cmy"),
                        ("0,0,1", "hsb"), ("0,0,1", "Hsb"), ("0,0,240", "HSB"), ("black!0", None),
                        ("red!0!white", None), ("-black", None)]:  # fmt: skip
        assert latex_colour(spec, model) == pytest.approx(WHITE), (spec, model)
    assert latex_colour("red!50!blue") == pytest.approx((0.5, 0.0, 0.5))
    assert latex_colour("red!25") == pytest.approx((1.0, 0.75, 0.75))  # 25% red, 75% white
    assert latex_colour("ForestGreen") == pytest.approx(
        (0.09 * 0.88, 0.88, 0.12 * 0.88)
    )  # cmyk .91,0,.88,.12
    assert latex_colour("no such colour") is None
    for value in ("#fff", "#FFFFFF", "white", "rgb(255, 255, 255)", "rgb(100%,100%,100%)", "hsl(0,0%,100%)"):
        assert css_colour(value) == (pytest.approx(WHITE), 1.0), value
    assert css_colour("#00000000")[1] == 0.0 and css_colour("transparent")[1] == 0.0
    assert contrast((0, 0, 0), WHITE) == pytest.approx(21.0)
    assert not readable((1, 1, 0), WHITE) and readable((1, 0, 0), WHITE)
    assert not readable((0, 0, 0), WHITE, opacity=0.05)


def test_hiding_stays_linear_in_the_text():
    """Openers without closers, closers without openers, thousands of groups: each scan moves forward once."""
    import time

    n = 32_768
    texts = [
        "{" * (n // 3) + "\\]" * (n // 3),
        "\\textcolor{red}{" * (n // 16),
        "\\textcolor{red" * (n // 14),
        "\\iftrue " * (n // 8),
        "\\ifthenelse{" * (n // 12),
        "<span>" * (n // 12) + "</div>" * (n // 12),
        '<span "' * (n // 7),
        "[a]: # (\n" * (n // 9),
        "1% " * (n // 3) + "\\boxed{8}",
        "<details>" * (n // 9),
    ]
    for text in texts:
        start = time.process_time()
        visible(text[:n])
        assert time.process_time() - start < 2.0, text[:40]


# ----------------------------------------------------------------------------------------------- property
INVISIBLE_LATEX_COLOURS = st.sampled_from(
    ["white", "White", "WHITE", "white!100", "black!0", "black!5", "white!95!black", "gray!4", "yellow",
     "Yellow", "-black", "red!0", "[rgb]{1,1,1", "[RGB]{255,255,255", "[HTML]{FFFFFF", "[HTML]{fefefe",
     "[gray]{1", "[gray]{0.97", "[cmyk]{0,0,0,0", "[cmyk]{0,0,0,0.02", "[hsb]{0.3,0,1", "nosuchcolour"]
)  # fmt: skip
INVISIBLE_CSS = st.sampled_from(
    ["display:none", "display: none !important", "visibility:hidden", "visibility: collapse", "opacity:0",
     "opacity: 1%", "color:#fff", "color: #FFFFFF", "color:white", "color: rgb(255,255,255)",
     "color:rgba(0,0,0,0)", "color: hsl(60, 100%, 100%)", "color:transparent", "font-size:0",
     "font-size: 1px", "height:0; overflow:hidden", "transform: scale(0)", "clip-path: inset(50%)",
     "position:absolute; left:-10000px", "text-indent:-9999px", "color:red; background-color:red"]
)  # fmt: skip


def _colour_argument(spec: str) -> tuple[str, str]:
    """(``[model]``, ``{values}``) of a drawn colour: "[rgb]{1,1,1" -> ("[rgb]", "{1,1,1}")."""
    if spec.startswith("["):
        model, values = spec.split("]", 1)
        return model + "]", values + "}"
    return "", "{" + spec + "}"


@st.composite
def hiding(draw, inner: str) -> str:
    """``inner`` wrapped so that no reader sees it, one of many ways."""
    kind = draw(st.integers(0, 16))
    if kind == 0:
        model, colour = _colour_argument(draw(INVISIBLE_LATEX_COLOURS))
        return f"\\textcolor{model}{colour}{{{inner}}}"
    if kind == 1:
        model, colour = _colour_argument(draw(INVISIBLE_LATEX_COLOURS))
        return f"{{\\color{model}{colour} {inner}}}"
    if kind == 2:
        colour = draw(st.sampled_from(["black", "red", "blue", "Black", "[rgb]{0,0,0"]))
        model, spec = _colour_argument(colour)
        return draw(st.sampled_from([f"\\colorbox{model}{spec}{{\\color{model}{spec}{inner}}}",
                                     f"\\fcolorbox{{red}}{model}{spec}{{\\color{model}{spec} {inner}}}"]))  # fmt: skip
    if kind == 3:
        return draw(st.sampled_from([f"\\iffalse {inner} \\fi", f"\\iftrue \\else {inner}\\fi",
                                     f"\\unless\\iftrue {inner} \\fi", f"\\iffalse x\\else\\iffalse {inner}\\fi\\fi",
                                     f"\\ifnum 2>1 {inner}\\fi", f"\\ifx\\a\\b {inner} \\else {inner}\\fi",
                                     f"\\ifthenelse{{\\equal{{a}}{{b}}}}{{{inner}}}{{}}"]))  # fmt: skip
    if kind == 4:
        factor = draw(st.sampled_from(["0", "0.0", "0.01", "0.3", "-0.1", "0.001"]))
        return draw(
            st.sampled_from([f"\\scalebox{{{factor}}}{{{inner}}}", f"\\scalebox{{1}}[{factor}]{{{inner}}}"])
        )
    if kind == 5:
        size = draw(st.sampled_from(["0pt", "0cm", "0.1pt", "1mm", "0.001\\linewidth", "3pt"]))
        return draw(
            st.sampled_from(
                [f"\\resizebox{{{size}}}{{!}}{{{inner}}}", f"\\resizebox*{{!}}{{{size}}}{{{inner}}}"]
            )
        )
    if kind == 6:
        box = draw(st.sampled_from(["phantom", "hphantom", "vphantom", "label", "sbox{\\b}", "invisible<2>"]))
        return f"\\{box}{{{inner}}}"
    if kind == 7:
        tag = draw(st.sampled_from(["span", "div", "p", "font", "section"]))
        return f'<{tag} style="{draw(INVISIBLE_CSS)}">{inner}</{tag}>'
    if kind == 8:
        return draw(st.sampled_from([f"<p hidden>{inner}</p>", f"<template>{inner}</template>",
                                     f"<details><summary>more</summary>{inner}</details>",
                                     f'<font color="#ffffff">{inner}</font>', f'<span class="hidden">{inner}</span>',
                                     f"<noscript>{inner}</noscript>", f'<a title="{inner}">see</a>']))  # fmt: skip
    if kind == 9:
        return draw(st.sampled_from([f"\n[//]: # ({inner})\n", f'\n[comment]: <> "{inner}"\n',
                                     f"\n[x]: #hidden '{inner}'\n", f"\n[//]: # (\n{inner}\n)\n"]))  # fmt: skip
    if kind == 10:
        return draw(
            st.sampled_from(
                [f" % {inner}\n", f" <!-- {inner} -->", f"\\begin{{comment}}{inner}\\end{{comment}}"]
            )
        )
    if kind == 11:
        number = draw(st.sampled_from(["1", "50", "$12$", "0.5 "]))
        return f" {number}% {inner}\n"
    if kind == 12:
        return f"\n\\end{{document}}\n{inner}"
    if kind == 13:
        return f"{{\\transparent{{{draw(st.sampled_from(['0', '0.01', '.05']))}}} {inner}}}"
    if kind == 14:
        return draw(st.sampled_from([f"\\raisebox{{-50cm}}{{{inner}}}", f"{{\\fontsize{{1pt}}{{1pt}}\\selectfont {inner}}}",
                                     f"\\style{{visibility:hidden}}{{{inner}}}"]))  # fmt: skip
    if kind == 15:  # two wrappers, one inside the other
        return draw(hiding(draw(hiding(inner))))
    return f"\\(\\color{{white}} {inner}\\)"


ANSWER_FORMS = st.sampled_from(
    ["\\boxed{{{}}}", "\\fbox{{{}}}", "<SOLUTION>{}</SOLUTION>", "\\boxed{{x = {}}}", "$\\boxed{{{}}}$"]
)


@given(
    data=st.data(),
    shown_value=st.integers(1, 49),
    hidden_value=st.integers(50, 99),
    form=ANSWER_FORMS,
    hidden_first=st.booleans(),
    filler=st.sampled_from(["", " ", "\n", "\n\n", " Let me check. ", "\nSo the result:\n"]),
)
@settings(
    derandomize=True,
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
def test_a_hidden_right_answer_never_beats_a_visible_wrong_one(
    data, shown_value, hidden_value, form, hidden_first, filler
):
    shown = form.format(shown_value)
    hidden = data.draw(hiding(form.format(hidden_value)))
    completion = hidden + filler + shown if hidden_first else shown + filler + hidden
    assert grade(completion, str(hidden_value)).status != "correct", completion
    if not hidden_first:  # what hides the hidden answer never hides the visible one written before it
        assert grade(completion, str(shown_value)).status == "correct", completion
