"""The web page of `sapiens-seg serve` in a real headless browser (Debian's chromium and
chromium-driver, driven by selenium): it loads, lists the models, a photo is chosen, and the
overlay and the class legend appear. The screenshot is written to the build tree, and to
docs/serve-page.png when SAPIENS_SEG_UPDATE_SCREENSHOT=1 (as it was for the committed one).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import BUILD, REPO
from test_serve import IMAGES, Server

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (tools/setup.sh)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
if not CHROMIUM or not DRIVER:
    pytest.skip("needs Debian's chromium and chromium-driver (tools/setup.sh)",
                allow_module_level=True)


@pytest.fixture()
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900", f"--user-data-dir={tmp_path / 'profile'}",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(arg)
    service = webdriver.ChromeService(executable_path=DRIVER)
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def test_page_segments_a_photo(browser):
    server = Server()
    try:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
        assert "tiny_b_torchscript.pt2" in browser.find_element(By.ID, "model").text
        photo = IMAGES / "astronaut.jpg"
        browser.find_element(By.ID, "file").send_keys(str(photo))
        # The overlay is shown once its PNG has arrived and decoded.
        wait.until(lambda d: d.execute_script(
            "const i = document.getElementById('overlay');"
            "return !i.hidden && i.complete && i.naturalWidth > 0;"))
        size = browser.execute_script(
            "const i = document.getElementById('overlay'); return [i.naturalWidth, i.naturalHeight];")
        photo_size = browser.execute_script(
            "const i = document.getElementById('photo'); return [i.naturalWidth, i.naturalHeight];")
        assert size == photo_size and size[0] > 0
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#legend tr"))
        rows = browser.find_elements(By.CSS_SELECTOR, "#legend tr")
        assert rows and "%" in rows[0].text
        assert "network" in browser.find_element(By.ID, "status").text
        shot = BUILD / "serve-page.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("SAPIENS_SEG_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(shot, REPO / "docs" / "serve-page.png")
    finally:
        assert server.stop() == 0
