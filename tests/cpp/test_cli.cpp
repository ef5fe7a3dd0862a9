// Pieces of the CLI: how paths that are not UTF-8 are written into JSON, plain text for
// terminals, the output-name registry, and which files are inputs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>

#include "cli/files.hpp"
#include "cli/inputs.hpp"
#include "cli/json_paths.hpp"
#include "cli/naming.hpp"
#include "cli/stop.hpp"
#include "cli/video_reader.hpp"
#include "test_util.hpp"

using namespace sapiens_seg::cli;
using sapiens_seg::ErrorCode;

TEST(UnitCliJson, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain/ascii.png"));
  EXPECT_TRUE(is_valid_utf8("caf\xC3\xA9.png"));                // é
  EXPECT_TRUE(is_valid_utf8("\xE2\x82\xAC \xF0\x9F\x98\x80"));  // € and an emoji
  EXPECT_FALSE(is_valid_utf8("caf\xE9.png"));                   // Latin-1 é
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));                      // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));                  // a UTF-16 surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));              // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE2\x82"));                      // cut short
}

TEST(UnitCliJson, DisplayTextEscapesOnlyInvalidBytes) {
  EXPECT_EQ(display_text("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(display_text("caf\xE9.png"), "caf\\xE9.png");
  EXPECT_EQ(display_text("\xFF\xC3\xA9\xC3"), "\\xFF\xC3\xA9\\xC3");
}

TEST(UnitCliJson, PathsRoundTripThroughJsonText) {
  std::mt19937 rng(5);
  std::vector<std::string> paths = {"out/a.png", "out/caf\xE9.png", "d\\xE9.png", "\xFF",
                                    std::string("nul\0inside", 10)};
  for (int c = 0; c < 256; ++c) paths.push_back("x" + std::string(1, static_cast<char>(c)));
  for (int i = 0; i < 500; ++i) {
    std::string p(rng() % 40, '\0');
    for (auto& ch : p) ch = static_cast<char>(rng() % 256);
    paths.push_back(p);
  }
  for (const auto& p : paths) {
    nlohmann::json entry = nlohmann::json::object();
    put_path(entry, "input", p);
    EXPECT_EQ(entry.contains("input_hex"), !is_valid_utf8(p));
    const std::string text = entry.dump();  // throws on invalid UTF-8: it must not
    EXPECT_EQ(get_path(nlohmann::json::parse(text), "input"), p);
  }
  // A name that is valid UTF-8 but looks like an escape is kept as it is.
  nlohmann::json e = nlohmann::json::object();
  put_path(e, "input", "d\\xE9.png");
  EXPECT_EQ(e["input"], "d\\xE9.png");
  EXPECT_FALSE(e.contains("input_hex"));
}

TEST(UnitCliJson, DumpNeverThrows) {
  const nlohmann::json j = {{"bad", std::string("\xE9")}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  EXPECT_EQ(dump_json(j), "{\"bad\":\"\xEF\xBF\xBD\"}");
}

// ---- plain text: one record per line, no escape sequence on a terminal ----------------------

TEST(UnitCliText, PlainTextEscapesControlCharacters) {
  EXPECT_EQ(plain_text("photo.jpg"), "photo.jpg");
  EXPECT_EQ(plain_text("caf\xC3\xA9 \xE2\x82\xAC.png"), "caf\xC3\xA9 \xE2\x82\xAC.png");
  EXPECT_EQ(plain_text("a\nb.png"), "a\\x0Ab.png");
  EXPECT_EQ(plain_text("a\rb\tc"), "a\\x0Db\\x09c");
  EXPECT_EQ(plain_text("\x1b[31mred\x1b[0m.png"), "\\x1B[31mred\\x1B[0m.png");
  EXPECT_EQ(plain_text("del\x7f"), "del\\x7F");
  EXPECT_EQ(plain_text("c1\xC2\x9B"
                       "2J"),
            "c1\\xC2\\x9B2J");                                                   // CSI as C1
  EXPECT_EQ(plain_text("rtl\xE2\x80\xAEgnp.exe"), "rtl\\xE2\\x80\\xAEgnp.exe");  // U+202E
  EXPECT_EQ(plain_text("ls\xE2\x80\xA8x"), "ls\\xE2\\x80\\xA8x");                // U+2028
  EXPECT_EQ(plain_text("bad\xE9"), "bad\\xE9");
  EXPECT_EQ(plain_text("two\nlines", /*keep_newlines=*/true), "two\nlines");
  EXPECT_EQ(plain_text("esc\x1b", /*keep_newlines=*/true), "esc\\x1B");
  for (int c = 0; c < 256; ++c) {  // no byte at all passes as a C0 control or DEL
    const std::string t = plain_text(std::string(1, static_cast<char>(c)));
    for (const char k : t) EXPECT_FALSE(static_cast<unsigned char>(k) < 0x20 || k == 0x7f) << c;
  }
}

// ---- output names: decided before writing, never shared, stable across runs ------------------

namespace {

bool writes_everything(const std::string&) {
  return true;
}

NameRequest req(const std::string& path, bool video = false) {
  return {path, "/data/" + path, video, ""};
}

std::map<std::string, std::string> bases_by_path(const std::vector<NameRequest>& rs,
                                                 const std::set<std::string>& taken = {},
                                                 OverlayStyle style = OverlayStyle::kBlend) {
  const auto bases = assign_bases(rs, taken, style, writes_everything);
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i < rs.size(); ++i) out[rs[i].path] = bases[i];
  return out;
}

// Every claimed file name of the run, checked to be claimed once and not taken.
void expect_no_shared_file(const std::vector<NameRequest>& rs, const std::set<std::string>& taken,
                           OverlayStyle style) {
  const auto bases = assign_bases(rs, taken, style, writes_everything);
  std::map<std::string, std::string> owner;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const std::string name = std::filesystem::path(rs[i].path).filename().string();
    for (const auto& f : claimed_names(bases[i], name, rs[i].video, style, writes_everything)) {
      EXPECT_FALSE(taken.count(f)) << rs[i].path << " writes " << f;
      const auto [it, fresh] = owner.emplace(f, rs[i].path);
      EXPECT_TRUE(fresh) << f << " is written by " << it->second << " and " << rs[i].path;
    }
  }
}

}  // namespace

TEST(UnitCliNames, UniqueStemsKeepTheDemosNames) {
  const auto b = bases_by_path({req("a.jpg"), req("b.png"), req("clip.mp4", true)});
  EXPECT_EQ(b.at("a.jpg"), "a");
  EXPECT_EQ(b.at("b.png"), "b");
  EXPECT_EQ(b.at("clip.mp4"), "clip");
  const auto n = output_names("out", "a", "a.jpg", false, OverlayStyle::kBlend, writes_everything);
  EXPECT_EQ(n.labels_png, "out/a_seg.png");
  EXPECT_EQ(n.labels_npy, "out/a_seg.npy");
  EXPECT_EQ(n.mask_npy, "out/a.npy");
  EXPECT_EQ(n.overlay, "out/a_overlay.png");
  const auto s =
      output_names("out", "a", "a.jpg", false, OverlayStyle::kSideBySide, writes_everything);
  EXPECT_EQ(s.overlay, "out/a.jpg");
  const auto p = output_names("out", "a", "a.xyz", false, OverlayStyle::kSideBySide,
                              [](const std::string& e) { return e != ".xyz"; });
  EXPECT_EQ(p.overlay, "out/a.png");
}

TEST(UnitCliNames, AnInputNamedLikeAnotherInputsOutputSharesNoFile) {
  // x.jpg's labels are x_seg.npy, and so is x_seg.jpg's mask.
  const std::vector<NameRequest> rs = {req("x.jpg"), req("x_seg.jpg")};
  const auto b = bases_by_path(rs);
  EXPECT_EQ(b.at("x.jpg"), "x_jpg");
  EXPECT_EQ(b.at("x_seg.jpg"), "x_seg_jpg");
  expect_no_shared_file(rs, {}, OverlayStyle::kBlend);
}

TEST(UnitCliNames, SameStemsAreNamedByTheirOwnPathNotByOrder) {
  std::vector<NameRequest> rs = {req("a.jpg"), req("a.png")};
  const auto first = bases_by_path(rs);
  EXPECT_EQ(first.at("a.jpg"), "a_jpg");
  EXPECT_EQ(first.at("a.png"), "a_png");
  // a.bmp sorts first once added: the others keep their names, so --skip-existing finds them.
  rs.insert(rs.begin(), req("a.bmp"));
  const auto second = bases_by_path(rs);
  EXPECT_EQ(second.at("a.jpg"), "a_jpg");
  EXPECT_EQ(second.at("a.png"), "a_png");
  EXPECT_EQ(second.at("a.bmp"), "a_bmp");
  // Any order gives the same names.
  std::mt19937 rng(3);
  for (int k = 0; k < 20; ++k) {
    std::shuffle(rs.begin(), rs.end(), rng);
    EXPECT_EQ(bases_by_path(rs), second);
  }
}

TEST(UnitCliNames, SameNamesInDifferentFoldersAreHashedByPath) {
  const std::vector<NameRequest> rs = {req("a/photo.jpg"), req("b/photo.jpg"), req("c/other.png")};
  const auto b = bases_by_path(rs);
  EXPECT_NE(b.at("a/photo.jpg"), b.at("b/photo.jpg"));
  EXPECT_EQ(b.at("a/photo.jpg").rfind("photo_jpg_", 0), 0u) << b.at("a/photo.jpg");
  EXPECT_EQ(b.at("a/photo.jpg").size(), std::string("photo_jpg_").size() + 8);
  EXPECT_EQ(b.at("c/other.png"), "other");
  // The hash is of the input's own path: the same with a third photo.jpg elsewhere.
  auto more = rs;
  more.push_back(req("d/photo.jpg"));
  const auto b2 = bases_by_path(more);
  EXPECT_EQ(b2.at("a/photo.jpg"), b.at("a/photo.jpg"));
  EXPECT_EQ(b2.at("b/photo.jpg"), b.at("b/photo.jpg"));
}

TEST(UnitCliNames, NoOutputReplacesAnInputOrATakenFile) {
  // -o is the input folder with --overlay side-by-side: photo.jpg's picture would be photo.jpg.
  const std::vector<NameRequest> rs = {req("photo.jpg"), req("other.png")};
  const std::set<std::string> taken = {"photo.jpg", "other.png", "summary.json"};
  const auto b = bases_by_path(rs, taken, OverlayStyle::kSideBySide);
  EXPECT_EQ(b.at("photo.jpg"), "photo_jpg");
  EXPECT_EQ(b.at("other.png"), "other_png");
  expect_no_shared_file(rs, taken, OverlayStyle::kSideBySide);
  // With the blend overlay nothing collides.
  const auto blend = bases_by_path(rs, taken, OverlayStyle::kBlend);
  EXPECT_EQ(blend.at("photo.jpg"), "photo");
  // A file of the previous summary that belongs to another input is not written either.
  const auto c = bases_by_path({req("gone.jpg")}, {"gone_seg.png"});
  EXPECT_EQ(c.at("gone.jpg"), "gone_jpg");
}

TEST(UnitCliNames, PinnedBasesAreKeptUnlessTheyCollide) {
  std::vector<NameRequest> rs = {req("a.jpg"), req("a.png")};
  rs[0].pinned_base = "a";  // a.jpg ran alone before: its files are a_seg.png, ...
  auto b = bases_by_path(rs);
  EXPECT_EQ(b.at("a.jpg"), "a");
  EXPECT_EQ(b.at("a.png"), "a_png");
  expect_no_shared_file(rs, {}, OverlayStyle::kBlend);
  // Kept names hold their stem against a newcomer, as a fresh run would name all three.
  std::vector<NameRequest> three = {req("a.bmp"), req("a.jpg"), req("a.png")};
  three[1].pinned_base = "a_jpg";
  three[2].pinned_base = "a_png";
  EXPECT_EQ(bases_by_path(three), bases_by_path({req("a.bmp"), req("a.jpg"), req("a.png")}));
  // Pinned to a name that is now an input in the output folder: renamed by the rule.
  b = bases_by_path(rs, {"a_seg.png"});
  EXPECT_EQ(b.at("a.jpg"), "a_jpg");
}

TEST(UnitCliNames, HostileSetsNeverShareAFile) {
  // Names built to collide: stems that are other inputs' output names, with and without
  // extensions, in several folders, the same hash forced by equal identities of different paths.
  const std::vector<std::string> stems = {"a",         "a_seg",    "a_jpg", "a_jpg_seg",
                                          "a_overlay", "a_logits", "a_png", "a_jpg_00000000"};
  const std::vector<std::string> exts = {".jpg", ".png", ".seg", "", ".mp4"};
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    std::vector<NameRequest> rs;
    std::set<std::string> seen;
    const int count = 2 + static_cast<int>(rng() % 12);
    for (int k = 0; k < count; ++k) {
      const std::string dir = std::string(1, static_cast<char>('p' + rng() % 3));
      const std::string ext = exts[rng() % exts.size()];
      const std::string path = dir + "/" + stems[rng() % stems.size()] + ext;
      if (!seen.insert(path).second) continue;
      NameRequest r = req(path, ext == ".mp4");
      if (rng() % 5 == 0) r.identity = "/same";  // equal hashes for different paths
      rs.push_back(r);
    }
    std::set<std::string> taken;
    if (rng() % 2) taken.insert("a_seg.png");
    for (const auto style : {OverlayStyle::kBlend, OverlayStyle::kSideBySide}) {
      expect_no_shared_file(rs, taken, style);
    }
  }
}

TEST(UnitCliNames, PreviousOutputsGiveBackTheirBase) {
  EXPECT_EQ(base_of_output("labels_npy", "a_jpg_seg.npy"), "a_jpg");
  EXPECT_EQ(base_of_output("mask_npy", "x_seg.npy"), "x_seg");
  EXPECT_EQ(base_of_output("labels_png", "a_seg.png"), "a");
  EXPECT_EQ(base_of_output("overlay", "a_overlay.png"), "a");
  EXPECT_EQ(base_of_output("overlay", "photo_jpg.jpg"), "photo_jpg");  // side-by-side
  EXPECT_EQ(base_of_output("frames_dir", "clip_frames"), "clip");
  EXPECT_EQ(base_of_output("labels_png", "_seg.png"), "");
  EXPECT_EQ(base_of_output("labels_png", "a.png"), "");
  EXPECT_TRUE(looks_like_output_name("a_seg.png"));
  EXPECT_TRUE(looks_like_output_name("a_overlay.png"));
  EXPECT_TRUE(looks_like_output_name("a_seg.png.tmp4711.png"));
  EXPECT_FALSE(looks_like_output_name("a.png"));
  EXPECT_FALSE(looks_like_output_name("a.tmpx.png"));
}

// ---- inputs: lists, special files, unreadable folders, the output folder ---------------------

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "cli_tests_XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::all, ec);
    for (auto it = fs::recursive_directory_iterator(path, ec); it != fs::end(it);
         it.increment(ec)) {
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    }
    fs::remove_all(path, ec);
  }
};

void touch(const fs::path& p, const std::string& text = "x") {
  std::ofstream(p, std::ios::binary) << text;
}

InputRules rules_for(const std::string& out_dir = "", bool recursive = false) {
  InputRules r;
  r.exts = parse_extensions("jpg,png");
  r.recursive = recursive;
  r.out_dir = out_dir;
  return r;
}

std::vector<std::string> names_of(const ExpandedInputs& in) {
  std::vector<std::string> out;
  for (const auto& i : in.items) out.push_back(fs::path(i.path).filename().string());
  return out;
}

}  // namespace

TEST(UnitCliInputs, ListsWithAByteOrderMarkAndCrlf) {
  TempDir d;
  touch(d.path / "one.jpg");
  touch(d.path / "two.jpg");
  const fs::path list = d.path / "list.txt";
  touch(list, "\xEF\xBB\xBF" + (d.path / "one.jpg").string() + "\r\n# comment\r\n" +
                  (d.path / "two.jpg").string() + "\r\n\r\n");
  const ExpandedInputs in = expand_inputs({"@" + list.string()}, rules_for());
  EXPECT_EQ(names_of(in), (std::vector<std::string>{"one.jpg", "two.jpg"}));
  EXPECT_TRUE(in.problems.empty()) << in.problems[0].message;
}

TEST(UnitCliInputs, SpecialFilesAreRefusedAtOnceAndNamedForWhatTheyAre) {
  TempDir d;
  const fs::path fifo = d.path / "pipe.jpg";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  touch(d.path / "real.jpg");
  // Opening the FIFO would block this test forever: it must be refused from its type alone.
  const ExpandedInputs in = expand_inputs({fifo.string(), "/dev/null", d.path.string(),
                                           (d.path / "nope.jpg").string(), "@" + fifo.string()},
                                          rules_for());
  EXPECT_EQ(names_of(in), (std::vector<std::string>{"real.jpg"}));
  ASSERT_EQ(in.problems.size(), 5u);
  std::map<std::string, InputProblem> by_path;
  for (const auto& p : in.problems) by_path.emplace(p.path, p);
  EXPECT_EQ(by_path.count(fifo.string()), 1u);
  EXPECT_EQ(in.problems[0].code, ErrorCode::kInvalidInput);
  EXPECT_NE(in.problems[0].message.find("FIFO"), std::string::npos) << in.problems[0].message;
  EXPECT_EQ(in.problems[1].code, ErrorCode::kInvalidInput);
  EXPECT_NE(in.problems[1].message.find("character device"), std::string::npos);
  EXPECT_EQ(in.problems[1].message.find("not found"), std::string::npos);
  // The FIFO met in the folder walk (it has an image extension).
  EXPECT_NE(in.problems[2].message.find("FIFO"), std::string::npos) << in.problems[2].message;
  EXPECT_EQ(in.problems[3].code, ErrorCode::kNotFound);
  EXPECT_NE(in.problems[3].message.find("input not found"), std::string::npos);
  EXPECT_NE(in.problems[4].message.find("list file"), std::string::npos);
  EXPECT_NE(in.problems[4].message.find("FIFO"), std::string::npos);
  EXPECT_EQ(special_file_kind(d.path.string()), "a folder");
  EXPECT_EQ(special_file_kind(fifo.string()), "a FIFO (named pipe)");
  EXPECT_EQ(special_file_kind((d.path / "real.jpg").string()), "");
  EXPECT_EQ(special_file_kind((d.path / "nope").string()), "");
}

TEST(UnitCliInputs, AnUnreadableFolderIsOneProblemAndTheWalkGoesOn) {
  TempDir d;
  fs::create_directories(d.path / "in" / "a");
  fs::create_directories(d.path / "in" / "locked");
  fs::create_directories(d.path / "in" / "z");
  touch(d.path / "in" / "a" / "1.jpg");
  touch(d.path / "in" / "locked" / "2.jpg");
  touch(d.path / "in" / "z" / "3.jpg");
  fs::permissions(d.path / "in" / "locked", fs::perms::none);
  fs::permissions(d.path, fs::perms::all);
  fs::permissions(d.path / "in", fs::perms::all);
  fs::permissions(d.path / "in" / "a", fs::perms::all);
  fs::permissions(d.path / "in" / "z", fs::perms::all);
  // Root reads any folder: the walk runs in a child that has given up root.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    const ExpandedInputs in = expand_inputs({(d.path / "in").string()}, rules_for("", true));
    const bool ok = names_of(in) == std::vector<std::string>{"1.jpg", "3.jpg"} &&
                    in.problems.size() == 1 && in.problems[0].code == ErrorCode::kIo &&
                    in.problems[0].path == (d.path / "in" / "locked").string() &&
                    in.problems[0].message.find("Permission denied") != std::string::npos;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the walk did not report exactly the locked folder";
}

TEST(UnitCliInputs, TheOutputFolderIsNotTakenAsInputs) {
  TempDir d;
  const fs::path in = d.path / "photos";
  fs::create_directories(in / "out" / "deeper");
  fs::create_directories(in / "sub");
  touch(in / "a.jpg");
  touch(in / "sub" / "b.png");
  touch(in / "out" / "a_seg.png");
  touch(in / "out" / "deeper" / "c.jpg");
  // -o inside the searched tree: not entered at all.
  ExpandedInputs x = expand_inputs({in.string()}, rules_for((in / "out").string(), true));
  EXPECT_EQ(names_of(x), (std::vector<std::string>{"a.jpg", "b.png"}));
  ASSERT_EQ(x.notes.size(), 1u);
  EXPECT_NE(x.notes[0].find("output folder"), std::string::npos);
  // -o is the searched folder: its own outputs (by name, or listed by the previous summary)
  // and a killed run's temporary files are passed over, the photos are not.
  touch(in / "a_seg.png");
  touch(in / "a_overlay.png");
  touch(in / "a_jpg.jpg");  // a side-by-side picture the previous summary lists
  touch(in / "b_seg.png.tmp77.png");
  fs::create_directories(in / "clip_frames");
  touch(in / "clip_frames" / "frame_000000_seg.png");
  InputRules r = rules_for(in.string(), true);
  r.previous_outputs = {"a_jpg.jpg"};
  x = expand_inputs({in.string()}, r);
  EXPECT_EQ(names_of(x), (std::vector<std::string>{"a.jpg", "a_seg.png", "c.jpg", "b.png"}));
  EXPECT_EQ(x.excluded, 4u);
  // A file named twice (another spelling, or by a folder and by name) is one input.
  x = expand_inputs({(in / "a.jpg").string(), (in / "sub" / ".." / "a.jpg").string()}, rules_for());
  EXPECT_EQ(names_of(x), (std::vector<std::string>{"a.jpg"}));
}

// The CLI's .npy writer (the only one: the authors' demo files) streams its items in pieces; the
// file is what NumPy reads, and a write that cannot happen leaves nothing behind.
TEST(UnitCliFiles, NpyIsWhatNumPyReadsWrittenInPieces) {
  namespace fs = std::filesystem;
  const fs::path d = sapiens_seg::test::scratch_dir("cli_npy");
  const std::vector<std::int64_t> v = {0, 1, 27, -5, 3, 4};
  std::size_t at = 0, calls = 0;
  write_npy((d / "a.npy").string(), "<i8", 8, {2, 3}, [&](void* buf, std::size_t max_items) {
    const std::size_t n = std::min<std::size_t>({max_items, 4, v.size() - at});  // 2 pieces
    std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(at), n, static_cast<std::int64_t*>(buf));
    at += n;
    ++calls;
    return n;
  });
  EXPECT_GE(calls, 2u);
  const auto a = sapiens_seg::test::read_npy((d / "a.npy").string());
  EXPECT_EQ(a.dtype, "<i8");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(a.as<std::int64_t>()[i], v[i]);
  EXPECT_EQ(fs::file_size(d / "a.npy") % 64, 48u % 64);  // 64-byte aligned header + 48 data bytes
  sapiens_seg::test::expect_error(
      [&] {
        write_npy((d / "no" / "such" / "dir.npy").string(), "|u1", 1, {1},
                  [](void*, std::size_t) { return std::size_t{0}; });
      },
      ErrorCode::kIo, {"dir.npy"});
  EXPECT_FALSE(fs::exists(d / "no"));
  for (const auto& e : fs::directory_iterator(d)) {
    EXPECT_EQ(e.path().filename(), "a.npy") << "left behind: " << e.path();
  }
  fs::remove_all(d);
}

// ---- issue 39: writes that fail, the output folder's lock, killed runs, long paths, MP4 facts
// ----

// Under a file size limit (RLIMIT_FSIZE, `ulimit -f`) a write fails with EFBIG and is an I/O
// error naming the limit; with SIGXFSZ ignored (install_stop_handlers) the process lives, and
// neither the file nor its temporary file is left. In a child process: the limit and the
// handlers are process-wide.
TEST(UnitCliFiles, AFileSizeLimitIsAnErrorThatLeavesNothing) {
  namespace fs = std::filesystem;
  const fs::path d = sapiens_seg::test::scratch_dir("cli_fsize");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    install_stop_handlers();
    const struct rlimit lim { 1000, 1000 };
    ::setrlimit(RLIMIT_FSIZE, &lim);
    int status = 0;
    const std::string big(5000, 'x');
    try {
      write_file((d / "big.bin").string(), big.data(), big.size());
      status = 1;  // no error
    } catch (const sapiens_seg::Error& e) {
      const std::string m = e.what();
      if (e.code() != ErrorCode::kIo || m.find("File too large") == std::string::npos ||
          m.find("1000 bytes") == std::string::npos || m.find("big.bin") == std::string::npos) {
        status = 2;
      }
    }
    try {
      write_file((d / "small.bin").string(), big.data(), 500);  // under the limit: written
    } catch (...) {
      status = 3;
    }
    ::_exit(status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"small.bin"});
  fs::remove_all(d);
}

// One run at a time writes into a folder: a second lock (another process, or here another open
// of the file) is refused with the holder's pid and the lock's path; the lock goes with its
// holder, and the next run takes it.
TEST(UnitCliFiles, TheOutputFolderLockIsExclusiveAndNamesItsHolder) {
  namespace fs = std::filesystem;
  const fs::path d = sapiens_seg::test::scratch_dir("cli_lock");
  {
    const OutDirLock first(d.string());
    EXPECT_EQ(first.unsupported(), "");
    EXPECT_TRUE(fs::exists(d / lock_file_name()));
    sapiens_seg::test::expect_error(
        [&] { OutDirLock second(d.string()); }, ErrorCode::kIo,
        {"another sapiens-seg run", "pid " + std::to_string(::getpid()), ".sapiens-seg.lock"});
  }
  EXPECT_FALSE(fs::exists(d / lock_file_name()));
  { const OutDirLock again(d.string()); }
  fs::remove_all(d);
}

// What a killed run leaves (<file>.tmp<pid><ext of file>, <base>_overlay.partial.mp4, in the
// folder and its <base>_frames folders) is removed by the next run; files of other names stay.
TEST(UnitCliFiles, StaleTemporaryFilesAreRemovedAndNothingElse) {
  namespace fs = std::filesystem;
  EXPECT_TRUE(is_temp_file_name("x_seg.png.tmp123.png"));
  EXPECT_TRUE(is_temp_file_name("x.npy.tmp7.npy"));
  EXPECT_TRUE(is_temp_file_name("summary.json.tmp42.json"));
  EXPECT_TRUE(is_temp_file_name(".sapiens-seg-write-test.tmp99"));
  EXPECT_TRUE(is_temp_file_name("clip_overlay.partial.mp4"));
  EXPECT_FALSE(is_temp_file_name("holiday.tmp2023"));
  EXPECT_FALSE(is_temp_file_name("notes.tmp1.txt"));
  EXPECT_FALSE(is_temp_file_name("x_seg.png.tmp.png"));
  EXPECT_FALSE(is_temp_file_name("x_seg.png"));
  const fs::path d = sapiens_seg::test::scratch_dir("cli_stale");
  fs::create_directories(d / "clip_frames");
  fs::create_directories(d / "photos");
  for (const fs::path& p :
       {d / "a_seg.png.tmp5.png", d / "clip_overlay.partial.mp4",
        d / "clip_frames" / "frame_000001_seg.png.tmp5.png", d / "photos" / "b_seg.png.tmp5.png",
        d / "holiday.tmp2023", d / "a_seg.png"}) {
    std::ofstream(p) << "x";
  }
  EXPECT_EQ(remove_stale_temp_files(d.string()), 3u);
  EXPECT_TRUE(fs::exists(d / "holiday.tmp2023"));
  EXPECT_TRUE(fs::exists(d / "a_seg.png"));
  EXPECT_TRUE(fs::exists(d / "photos" / "b_seg.png.tmp5.png"));  // not a folder of ours
  fs::remove_all(d);
}

// A folder walk that meets a path longer than PATH_MAX reports it as an error entry; it was
// dropped without a word (the folder's type could not be read, and it has no image extension).
TEST(UnitCliInputs, APathLongerThanPathMaxIsReportedNotDropped) {
  namespace fs = std::filesystem;
  const fs::path d = sapiens_seg::test::scratch_dir("cli_long");
  std::ofstream(d / "top.png") << "x";
  const std::string name(200, 'd');
  int dir = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dir, 0);
  for (int i = 0; i < 25; ++i) {  // 25 x 201 bytes
    ASSERT_EQ(::mkdirat(dir, name.c_str(), 0755), 0);
    const int next = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY);
    ::close(dir);
    dir = next;
    ASSERT_GE(dir, 0);
  }
  const int f = ::openat(dir, "deep.png", O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(f, 0);
  ::close(f);
  ::close(dir);
  InputRules rules;
  rules.exts = {".png"};
  rules.recursive = true;
  const ExpandedInputs in = expand_inputs({d.string()}, rules);
  ASSERT_EQ(in.items.size(), 1u);
  EXPECT_EQ(fs::path(in.items[0].path).filename(), "top.png");
  ASSERT_EQ(in.problems.size(), 1u);
  EXPECT_EQ(in.problems[0].code, ErrorCode::kIo);
  EXPECT_NE(in.problems[0].message.find("File name too long"), std::string::npos);
  EXPECT_NE(in.problems[0].message.find("at most 4096 bytes"), std::string::npos);
  EXPECT_GT(in.problems[0].path.size(), 4096u);
  // Without --recursive the walk has nothing to say about sub-folders.
  rules.recursive = false;
  EXPECT_TRUE(expand_inputs({d.string()}, rules).problems.empty());
  // std::filesystem cannot remove what it cannot name: `rm -rf` works relative to each folder.
  ASSERT_EQ(std::system(("rm -rf " + d.string()).c_str()), 0);
}

// The video reader on files ffmpeg makes here: a phone's display matrix turns the picture as
// players show it, every frame comes out in order at its own size, a healthy file is not called
// truncated and a cut one is, and what is no video is a clear error, never a crash.
TEST(UnitCliVideoReader, TurnsFramesAsPlayersShowThemAndTellsCutFilesFromHealthyOnes) {
  if (std::system("ffmpeg -version >/dev/null 2>&1") != 0) {
    GTEST_SKIP()
        << "ffmpeg (Debian's ffmpeg package, installed by tools/setup.sh) makes the videos";
  }
  const fs::path d = fs::temp_directory_path() / ("video_reader_" + std::to_string(::getpid()));
  fs::create_directories(d);
  const auto make = [&](const std::string& args, const fs::path& out) {
    const std::string cmd = "ffmpeg -v error -y " + args + " '" + out.string() + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  };
  const fs::path plain = d / "plain.mp4", turned = d / "turned.mp4", cut = d / "cut.mkv";
  make("-f lavfi -i testsrc=size=64x48:rate=10 -frames:v 12 -pix_fmt yuv420p -c:v libx264", plain);
  make("-i '" + plain.string() + "' -c copy -metadata:s:v:0 rotate=90", turned);
  make("-i '" + plain.string() + "' -c copy", cut);
  const std::atomic<bool> go{false};

  const auto read_all = [&](const fs::path& p, std::vector<cv::Mat>& pictures) {
    VideoReader r(p.string(), go);
    VideoFrame f;
    while (r.next(f)) {
      EXPECT_EQ(f.index, static_cast<std::int64_t>(pictures.size()));
      EXPECT_TRUE(f.decoded);
      pictures.push_back(r.rgb().clone());
    }
    return r.end();
  };
  std::vector<cv::Mat> a, b;
  const VideoEnd ea = read_all(plain, a);
  EXPECT_EQ(ea.frames, 12);
  EXPECT_FALSE(ea.truncated) << ea.why;
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a[0].rows, 48);
  EXPECT_EQ(a[0].cols, 64);
  {
    VideoReader r(turned.string(), go);
    EXPECT_TRUE(r.info().rotation == 90 || r.info().rotation == 270) << r.info().rotation;
    EXPECT_FALSE(r.info().mirrored);
  }
  const VideoEnd eb = read_all(turned, b);
  EXPECT_FALSE(eb.truncated) << eb.why;
  ASSERT_EQ(b.size(), a.size());
  // The same pictures, a quarter turn apart, pixel for pixel (the same decoded frames).
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(b[i].rows, 64);
    ASSERT_EQ(b[i].cols, 48);
    cv::Mat back;
    cv::rotate(b[i], back,
               VideoReader(turned.string(), go).info().rotation == 90
                   ? cv::ROTATE_90_COUNTERCLOCKWISE
                   : cv::ROTATE_90_CLOCKWISE);
    EXPECT_EQ(cv::norm(back, a[i], cv::NORM_INF), 0.0) << "frame " << i;
  }

  // Cut: Matroska keeps its duration in the header, so a copy cut in half is truncated.
  const auto size = fs::file_size(cut);
  fs::resize_file(cut, size / 2);
  std::vector<cv::Mat> c;
  const VideoEnd ec = read_all(cut, c);
  EXPECT_TRUE(ec.truncated);
  EXPECT_LT(c.size(), a.size());
  EXPECT_FALSE(ec.why.empty());

  // Not a video, no file, and a cancelled read.
  const fs::path junk = d / "junk.mp4";
  std::ofstream(junk) << std::string(4096, 'x');
  for (const fs::path& p : {junk, d / "none.mp4"}) {
    try {
      VideoReader r(p.string(), go);
      ADD_FAILURE() << p << " opened";
    } catch (const sapiens_seg::Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kInvalidInput || e.code() == ErrorCode::kIo) << e.what();
      EXPECT_NE(std::string(e.what()).find(p.filename().string()), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(count_decodable_frames(junk.string()), -1);
  EXPECT_EQ(count_decodable_frames(plain.string()), 12);
  const std::atomic<bool> stop{true};
  VideoFrame f;
  try {
    VideoReader r(plain.string(), stop);
    EXPECT_FALSE(r.next(f));
  } catch (const sapiens_seg::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();  // cancelled while opening
  }
  fs::remove_all(d);
}
