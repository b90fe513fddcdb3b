/* test_continue_final.c - continue_final_message's cut (srv_continue_cut in
 * tools/kwker/serve/openai.c, included whole with the files it calls, as test_think.c does):
 * where a rendered prompt ends when the final message is continued, against transformers'
 * apply_chat_template rule (the tag kept: cut at it; trimmed by the template: cut before it and
 * the whitespace ahead, Python's str.isspace, multi-byte spaces too; the tag or the message
 * dropped: refused). The whole path through a template and a model is
 * tests/python/test_continue_final.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/think.c"
#include "../../tools/kwker/serve/toolcall.c"
#include "../../tools/kwker/serve/toolcall_reply.c"

#define TAG "CONTINUE_FINAL_MESSAGE_TAG"

static const struct {
    const char *text, *final;
    long want; /* the prompt's length, or -1 */
} CASES[] = {
    {"A: hi" TAG " <end>", "hi", 5},               /* the template kept the tag's space */
    {"A: hi " TAG "<end>", "hi ", 5},              /* it trimmed the content: so do we */
    {"A: hi \t\n" TAG "<end>", "hi", 5},
    {"A: hi\xe3\x80\x80" TAG "<end>", "hi", 5},    /* U+3000, a space to Python */
    {"A: hi\xc2\xa0" TAG "<end>", "hi", 5},        /* U+00A0 */
    {"A: hi\x1c" TAG "<end>", "hi", 5},            /* a separator isspace() takes */
    {"A: hi\xf0\x9f\x98\x80" TAG "<end>", "hi", 9}, /* an emoji is not a space */
    {"A: hi\xe2\x80\x8b" TAG "<end>", "hi", 8},    /* nor is U+200B */
    {"U: " TAG " A: hi" TAG " <end>", "hi", 35},   /* the tag quoted earlier: the last one */
    {"A: " TAG " <end>", "", 3},                   /* an empty final message */
    {"A: hi" TAG " <end>", "  hi \n", 5},          /* the final content is stripped to look */
    {"A: hello <end>", "hi", -1},                  /* the template dropped the message */
    {"A: hi <end>", "hi", -1},                     /* or the tag */
    {"A: " TAG " <end>", "bye", -1},
};

int main(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        long got = srv_continue_cut(CASES[i].text, strlen(CASES[i].text), CASES[i].final,
                                    strlen(CASES[i].final));
        T_CHECK(got == CASES[i].want, "case %zu: %ld, want %ld", i, got, CASES[i].want);
    }
    /* the cut never reads before the text: a text that is all spaces before the tag */
    static const char spaces[] = "  \xe3\x80\x80" TAG "x";
    T_EQ(srv_continue_cut(spaces, sizeof spaces - 1, "", 0), 0);
    return t_report("test_continue_final");
}
