/* Native kernel of apportion.engine.keys: the three key schemes for one key or a whole
 * sequence, in C, with exactly the results of the pure Python path (checked against it by
 * tests/unit/test_keys_native.py on arbitrary Unicode).
 *
 * xxh3-64 comes from the system's xxhash.h (Debian libxxhash-dev); its source is not copied
 * here. It is compiled in (XXH_INLINE_ALL) rather than linked: the extension then needs libc
 * alone, which a manylinux wheel may assume, and the per-key call inlines (3 % fewer
 * instructions batched, callgrind). The extension is optional: without it
 * apportion.engine.keys uses the Python path.
 *
 *   apportion_unit(key, count) -> int     apportion_units(keys, count, out) -> None
 *   netherite_unit(key, count) -> int     netherite_units(keys, count, out) -> None
 *   akka_unit(key, count) -> int          akka_units(keys, count, out) -> None
 *
 * `out` is a writable C-contiguous int64 buffer (a numpy array) of len(keys) items.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define MAX_COUNT 2147483647LL
#define FNV_OFFSET 0x811C9DC5u
#define FNV_PRIME 0x01000193u
#define PREFETCH 16
/* The per-key path: inlined into each scheme's loop. */
#define HOT static inline __attribute__((always_inline))

/* Scratch space for the UTF-8 bytes of non-ASCII keys; small keys stay on the stack. */
typedef struct {
    unsigned char *data;
    Py_ssize_t capacity;
    unsigned char small[256];
} Buffer;

static void buffer_init(Buffer *buf)
{
    buf->data = buf->small;
    buf->capacity = (Py_ssize_t)sizeof(buf->small);
}

static void buffer_free(Buffer *buf)
{
    if (buf->data != buf->small)
        PyMem_Free(buf->data);
}

static int buffer_reserve(Buffer *buf, Py_ssize_t size)
{
    if (size <= buf->capacity)
        return 0;
    /* The old contents are never needed: every key is encoded from scratch. */
    unsigned char *data = PyMem_Malloc((size_t)size);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer_free(buf);
    buf->data = data;
    buf->capacity = size;
    return 0;
}

static int check_count(PyObject *obj, uint64_t *count)
{
    long long n = PyLong_AsLongLong(obj);
    if (n == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
    }
    else if (1 <= n && n <= MAX_COUNT) {
        *count = (uint64_t)n;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "count must be between 1 and %lld, got %S", MAX_COUNT, obj);
    return -1;
}

static int check_str(PyObject *key)
{
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_TypeError, "keys must be str, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(key) < 0)
        return -1;
#endif
    return 0;
}

/* The UTF-8 bytes of a non-ASCII `key` as .NET's Encoding.UTF8 writes them: a surrogate pair
 * is one astral character, a lone surrogate becomes U+FFFD. Encoded here rather than by
 * PyUnicode_AsUTF8AndSize, which would cache a UTF-8 copy on every caller's string. */
static const unsigned char *encode_utf8(PyObject *key, Buffer *buf, Py_ssize_t *size)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(key);
    if (buffer_reserve(buf, 4 * n) < 0)
        return NULL;
    int kind = PyUnicode_KIND(key);
    const void *data = PyUnicode_DATA(key);
    unsigned char *out = buf->data;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            *out++ = (unsigned char)c;
            continue;
        }
        if (0xD800 <= c && c <= 0xDFFF) {
            Py_UCS4 low = i + 1 < n ? PyUnicode_READ(kind, data, i + 1) : 0;
            if (c <= 0xDBFF && 0xDC00 <= low && low <= 0xDFFF) {
                c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
                i++;
            }
            else {
                c = 0xFFFD;
            }
        }
        if (c < 0x800) {
            *out++ = (unsigned char)(0xC0 | (c >> 6));
        }
        else if (c < 0x10000) {
            *out++ = (unsigned char)(0xE0 | (c >> 12));
            *out++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        }
        else {
            *out++ = (unsigned char)(0xF0 | (c >> 18));
            *out++ = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
            *out++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        }
        *out++ = (unsigned char)(0x80 | (c & 0x3F));
    }
    *size = out - buf->data;
    return buf->data;
}

/* The UTF-8 bytes of `key`: an ASCII string is its own UTF-8, read in place with no copy. */
HOT const unsigned char *utf8(PyObject *key, Buffer *buf, Py_ssize_t *size)
{
    if (PyUnicode_IS_ASCII(key)) {
        *size = PyUnicode_GET_LENGTH(key);
        return PyUnicode_DATA(key);
    }
    return encode_utf8(key, buf, size);
}

/* The n of a key ending in "!n" (n an unsigned 32-bit decimal number, ASCII digits), as
 * keys.suffix_index. '!' and digits are ASCII, which UTF-8 never uses inside a multi-byte
 * character, so scanning the bytes is scanning the characters: the text after the last '!' is
 * all digits exactly when the trailing digit run starts right after a '!'. */
HOT int suffix(const unsigned char *s, Py_ssize_t size, uint64_t *value)
{
    Py_ssize_t start = size;
    while (start > 0 && (unsigned)(s[start - 1] - '0') <= 9)
        start--;
    if (start == size || start == 0 || s[start - 1] != '!')
        return 0;
    while (start < size - 1 && s[start] == '0')
        start++;
    if (size - start > 10)
        return 0;
    uint64_t n = 0;
    for (; start < size; start++)
        n = n * 10 + (uint64_t)(s[start] - '0');
    if (n > 0xFFFFFFFFu)
        return 0;
    *value = n;
    return 1;
}

typedef int (*SchemeFn)(PyObject *key, uint64_t count, Buffer *buf, int64_t *unit);

/* xxh3-64 reduced by multiply-shift (h * count) >> 64; "!n" pins to n mod count. */
HOT int apportion_key(PyObject *key, uint64_t count, Buffer *buf, int64_t *unit)
{
    Py_ssize_t size;
    uint64_t n;
    if (check_str(key) < 0)
        return -1;
    const unsigned char *s = utf8(key, buf, &size);
    if (s == NULL)
        return -1;
    if (suffix(s, size, &n)) {
        *unit = (int64_t)(n % count);
        return 0;
    }
    uint64_t h = XXH3_64bits(s, (size_t)size);
    *unit = (int64_t)(((unsigned __int128)h * count) >> 64);
    return 0;
}

/* Netherite: "!n" pins to n mod count, else FNV-1a-32 of the UTF-8 bytes mod count. */
HOT int netherite_key(PyObject *key, uint64_t count, Buffer *buf, int64_t *unit)
{
    Py_ssize_t size;
    uint64_t n;
    if (check_str(key) < 0)
        return -1;
    const unsigned char *s = utf8(key, buf, &size);
    if (s == NULL)
        return -1;
    if (!suffix(s, size, &n)) {
        uint32_t h = FNV_OFFSET;
        for (Py_ssize_t i = 0; i < size; i++)
            h = (h ^ s[i]) * FNV_PRIME;
        n = h;
    }
    *unit = (int64_t)(n % count);
    return 0;
}

/* Akka: abs(String.hashCode % count), hashCode = 31*h + c over the UTF-16 code units (an astral
 * character is a surrogate pair; lone surrogates are code units as they stand). */
HOT int akka_key(PyObject *key, uint64_t count, Buffer *buf, int64_t *unit)
{
    (void)buf;
    if (check_str(key) < 0)
        return -1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(key);
    const void *data = PyUnicode_DATA(key);
    uint32_t h = 0;
    switch (PyUnicode_KIND(key)) {
    case PyUnicode_1BYTE_KIND:
        for (Py_ssize_t i = 0; i < n; i++)
            h = 31 * h + ((const Py_UCS1 *)data)[i];
        break;
    case PyUnicode_2BYTE_KIND:
        for (Py_ssize_t i = 0; i < n; i++)
            h = 31 * h + ((const Py_UCS2 *)data)[i];
        break;
    default:
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = ((const Py_UCS4 *)data)[i];
            if (c >= 0x10000) {
                c -= 0x10000;
                h = 31 * h + (0xD800 + (c >> 10));
                c = 0xDC00 + (c & 0x3FF);
            }
            h = 31 * h + c;
        }
    }
    /* Java's % keeps the dividend's sign, so abs(h % n) == abs(h) % n; abs in 64 bits
       because abs(INT32_MIN) does not fit in 32. */
    int64_t signed_h = (int32_t)h;
    *unit = (int64_t)((uint64_t)(signed_h < 0 ? -signed_h : signed_h) % count);
    return 0;
}

/* one() and many() are instantiated per scheme (SCHEME below) with the scheme's function
   inlined into them: no call per key but the hash's own. */
HOT PyObject *one(SchemeFn fn, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t count;
    int64_t unit;
    Buffer buf;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 2 arguments (key, count), %zd given", name,
                     nargs);
        return NULL;
    }
    if (check_count(args[1], &count) < 0)
        return NULL;
    buffer_init(&buf);
    int rc = fn(args[0], count, &buf, &unit);
    buffer_free(&buf);
    return rc < 0 ? NULL : PyLong_FromLongLong(unit);
}

static int is_int64(const Py_buffer *view)
{
    const char *f = view->format;
    if (view->itemsize != 8 || f == NULL)
        return 0;
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return (f[0] == 'l' || f[0] == 'q') && f[1] == '\0';
}

HOT PyObject *many(SchemeFn fn, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t count;
    Py_buffer view;
    Buffer buf;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 arguments (keys, count, out), %zd given",
                     name, nargs);
        return NULL;
    }
    if (check_count(args[1], &count) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *seq = NULL;
    if (!is_int64(&view)) {
        PyErr_SetString(PyExc_TypeError, "out must be a writable contiguous int64 buffer");
        goto fail;
    }
    seq = PySequence_Fast(args[0], "keys must be a sequence of str");
    if (seq == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (view.len != n * 8) {
        PyErr_Format(PyExc_ValueError, "out holds %zd items, keys %zd", view.len / 8, n);
        goto fail;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int64_t *out = view.buf;
    buffer_init(&buf);
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Strings are read once each: fetch a few ahead so that memory latency overlaps. */
        if (i + PREFETCH < n)
            __builtin_prefetch(items[i + PREFETCH]);
        if (fn(items[i], count, &buf, &out[i]) < 0) {
            buffer_free(&buf);
            goto fail;
        }
    }
    buffer_free(&buf);
    Py_DECREF(seq);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(seq);
    PyBuffer_Release(&view);
    return NULL;
}

#define SCHEME(scheme)                                                                        \
    static PyObject *scheme##_unit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)   \
    {                                                                                         \
        (void)self;                                                                           \
        return one(scheme##_key, #scheme "_unit", args, nargs);                               \
    }                                                                                         \
    static PyObject *scheme##_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs)  \
    {                                                                                         \
        (void)self;                                                                           \
        return many(scheme##_key, #scheme "_units", args, nargs);                             \
    }

SCHEME(apportion)
SCHEME(netherite)
SCHEME(akka)

#define METHODS(scheme)                                                                       \
    {#scheme "_unit", (PyCFunction)(void (*)(void))scheme##_unit, METH_FASTCALL,              \
     "The unit of one key (" #scheme " scheme)."},                                            \
    {#scheme "_units", (PyCFunction)(void (*)(void))scheme##_units, METH_FASTCALL,            \
     "Writes the unit of each key into out (" #scheme " scheme)."}

static PyMethodDef methods[] = {
    METHODS(apportion),
    METHODS(netherite),
    METHODS(akka),
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module)
{
    /* The libxxhash the kernel runs with, for the benchmark's report. */
    return PyModule_AddIntConstant(module, "XXHASH_VERSION", (long)XXH_versionNumber());
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "apportion.engine._keys",
    .m_doc = "Native kernel of apportion.engine.keys (optional; same results as the Python path).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__keys(void)
{
    return PyModuleDef_Init(&module_def);
}
